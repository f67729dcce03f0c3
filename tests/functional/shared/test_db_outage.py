"""The pool through a real database outage: a proxy between it and PostgreSQL is cut.

The pool must fail fast and recognisably (:func:`shared.db.errors.is_transient`) while
the database is away, never hang beyond its timeouts, and hand out working
connections again once it is back, without being rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.config import DatabaseSettings
from shared.db.errors import is_transient, is_unavailable
from shared.db.pool import create_pool
from tests.faults.proxy import TcpProxy, url_through
from tests.polling import wait_until

pytestmark = pytest.mark.functional

SETTINGS = DatabaseSettings(
    pool_min_size=1, pool_max_size=2, connect_timeout=5, acquire_timeout=1, command_timeout=2
)


@pytest.fixture
async def pool(database_url: str, pg_proxy: TcpProxy) -> AsyncIterator[asyncpg.Pool]:
    proxied = await create_pool(url_through(database_url, pg_proxy.address), SETTINGS)
    yield proxied
    proxied.terminate()


async def _running(db_pool: asyncpg.Pool, query: str) -> None:
    """Wait until ``query`` is running on the server."""

    async def running() -> bool:
        found: int = await db_pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", query
        )
        return found > 0

    await wait_until(running, what=f"{query} running", timeout=10)


async def test_a_query_cut_midway_fails_as_transient_and_the_pool_recovers(
    pool: asyncpg.Pool, db_pool: asyncpg.Pool, pg_proxy: TcpProxy
) -> None:
    query = "SELECT pg_sleep(1.5)"
    sleeping = asyncio.create_task(pool.fetchval(query))
    await _running(db_pool, query)
    await pg_proxy.cut()
    with pytest.raises(asyncpg.ConnectionDoesNotExistError) as cut_midway:
        await sleeping
    assert is_unavailable(cut_midway.value)

    with pytest.raises(ConnectionRefusedError) as refused:
        await pool.fetchval("SELECT 1")
    assert is_unavailable(refused.value)

    await pg_proxy.restore()
    assert await pool.fetchval("SELECT 1") == 1
    async with pool.acquire() as a, pool.acquire() as b:
        assert (await a.fetchval("SELECT 2"), await b.fetchval("SELECT 3")) == (2, 3)


async def test_a_silent_network_times_out_instead_of_hanging(
    pool: asyncpg.Pool, pg_proxy: TcpProxy
) -> None:
    first, second = await pool.acquire(), await pool.acquire()
    assert (await first.fetchval("SELECT 1"), await second.fetchval("SELECT 1")) == (1, 1)
    pg_proxy.stall()
    # A query on a connection that gets no answer times out (command timeout).
    with pytest.raises(TimeoutError) as no_answer:
        await first.fetchval("SELECT 1")
    assert is_transient(no_answer.value)
    # With every connection taken, waiting for one times out (acquire timeout).
    with pytest.raises(TimeoutError) as no_connection:
        await pool.fetchval("SELECT 1")
    assert is_transient(no_connection.value)
    # Giving back a connection that cannot be reset drops it (bounded, too).
    for conn in (first, second):
        with contextlib.suppress(TimeoutError):
            await pool.release(conn)
    # Connecting anew while nothing gets through times out as well.
    with pytest.raises(TimeoutError):
        await pool.fetchval("SELECT 1")
    await pg_proxy.restore()
    assert await pool.fetchval("SELECT 1") == 1
