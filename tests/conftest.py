"""Fixtures shared by every test layer.

Functional and end-to-end tests talk to a real PostgreSQL and RabbitMQ. Each test gets
its own migrated database (a copy of a template migrated once per run, see
:mod:`devkit.database`) and its own exchange, so tests never see each other's rows or
messages. Point the suite elsewhere with ``KEEL_TEST_PG`` (a server URL, any database)
and ``KEEL_TEST_AMQP``.

The host fences agents start outlive them by design; the run stops the ones it started
when it ends (:mod:`devkit.fences`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from devkit.broker import remove_exchange
from devkit.database import Scratch, scratch
from devkit.fences import stop_fences, tag_this_run
from devkit.servers import AMQP_URL, PG_SERVER
from shared.config import DatabaseSettings
from shared.db.pool import create_pool
from tests.faults.proxy import TcpProxy


@pytest.fixture(scope="session", autouse=True)
def fences_stopped_at_the_end() -> Iterator[None]:
    """Tag this run; at its end, stop the fences its agents started."""
    run_id = tag_this_run()
    yield
    stop_fences(run_id)


@pytest.fixture
def amqp_url() -> str:
    return AMQP_URL


@pytest.fixture
async def exchange() -> AsyncIterator[str]:
    """An exchange (and so a queue prefix) no other test uses; removed afterwards.

    Queues the test declared under it expire on their own (tests set ``queue_expires``).
    """
    name = f"keel-test-{uuid.uuid4().hex[:12]}"
    yield name
    await remove_exchange(name)


@pytest.fixture(scope="session")
async def databases() -> AsyncIterator[Scratch]:
    """This run's scratch databases on the test server; all dropped at its end."""
    async with scratch(PG_SERVER) as run:
        yield run


@pytest.fixture
async def database_url(databases: Scratch) -> AsyncIterator[str]:
    """A new, fully migrated database, dropped after the test."""
    url = await databases.migrated("test")
    yield url
    databases.drop_soon(url)


@pytest.fixture
async def db_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, DatabaseSettings(connect_timeout=5))
    yield pool
    await pool.close()


@pytest.fixture
async def pg_proxy() -> AsyncIterator[TcpProxy]:
    """A TCP proxy to the test PostgreSQL server that the test can cut and restore."""
    target = urlsplit(PG_SERVER)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def amqp_proxy() -> AsyncIterator[TcpProxy]:
    """A TCP proxy to the test RabbitMQ that the test can cut and restore."""
    target = urlsplit(AMQP_URL)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5672)
    await proxy.start()
    yield proxy
    await proxy.close()
