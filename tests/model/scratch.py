"""The model's connection pool to its scratch database: keel's pool, tuned for a test.

Every process of the model shares one real asyncpg pool (each behind its own
:class:`~tests.model.pool.ModelPool`). It is built as keel builds its own
(:func:`shared.db.pool.create_pool`: the same connection class, codecs and timeouts),
but for what only costs the model time:

* the database need not survive a crash: its commits do not wait for the disk;
* its connections go over PostgreSQL's local socket when the server is on this
  machine — every database step of the model is a round trip;
* neither its connections nor their prepared statements expire by age: each would keep
  a timer on the model's loop, and :meth:`~tests.model.runtime.Runtime.idle` looks
  through the loop's timers at every turn (hundreds of them, a few examples in). In the
  model, ages are counted on a clock that only moves when a sleep is skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from shared.config import DatabaseSettings
from shared.db.pool import KeelConnection, KeelPool
from shared.db.pool import _init_connection as keel_connection_init

#: Where PostgreSQL may keep its Unix sockets (Debian's, then the default).
SOCKET_DIRECTORIES = ("/var/run/postgresql", "/tmp")


async def scratch_pool(database_url: str) -> asyncpg.Pool:
    """The pool every process of the model shares (see the module's text)."""
    conn = await asyncpg.connect(database_url)
    try:
        name = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await conn.close()
    settings = DatabaseSettings(pool_max_size=30)
    pool = KeelPool(
        database_url,
        acquire_timeout=settings.acquire_timeout,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        max_queries=50_000,
        max_inactive_connection_lifetime=0,
        max_cached_statement_lifetime=0,
        init=keel_connection_init,
        loop=None,
        connection_class=KeelConnection,
        record_class=asyncpg.Record,
        timeout=settings.acquire_timeout,
        command_timeout=settings.command_timeout,
        **local_socket(database_url),
    )
    await pool
    return pool


def local_socket(database_url: str) -> dict[str, Any]:
    """``host`` and ``port`` of the server's Unix socket if it is on this machine, else
    nothing (the URL's address is used)."""
    url = urlsplit(database_url)
    if url.hostname not in ("127.0.0.1", "localhost", "::1"):
        return {}
    port = url.port or 5432
    for directory in SOCKET_DIRECTORIES:
        if Path(directory, f".s.PGSQL.{port}").exists():
            return {"host": directory, "port": port}
    return {}
