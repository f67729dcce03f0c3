"""Where the PostgreSQL and RabbitMQ servers the harness uses are.

Tests read ``KEEL_TEST_PG`` (a server URL whose user may create databases, any database)
and ``KEEL_TEST_AMQP``; benchmarks read ``KEEL_BENCH_PG`` and ``KEEL_BENCH_AMQP``. Unset,
both use this machine's servers as the README's quick start sets them up.
"""

from __future__ import annotations

import os

DEFAULT_PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def pg_server(variable: str = "KEEL_TEST_PG") -> str:
    """The PostgreSQL server URL named by ``variable``, or this machine's."""
    return os.environ.get(variable) or DEFAULT_PG_SERVER


def amqp_url(variable: str = "KEEL_TEST_AMQP") -> str:
    """The RabbitMQ URL named by ``variable``, or this machine's."""
    return os.environ.get(variable) or DEFAULT_AMQP_URL


#: The test servers.
PG_SERVER = pg_server()
AMQP_URL = amqp_url()
