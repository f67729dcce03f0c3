"""Transactions that lose a race run again: real serialization failures and deadlocks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from shared.db.pool import Connection
from shared.db.transaction import in_transaction

pytestmark = pytest.mark.functional

READ = "SELECT description FROM flavors WHERE flavorid = $1"
APPEND = "UPDATE flavors SET description = coalesce(description, '') || $2 WHERE flavorid = $1"


async def test_a_serialization_failure_runs_the_transaction_again(
    db_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    attempts = 0

    async def work(conn: Connection) -> int:
        nonlocal attempts
        attempts += 1
        await conn.fetchval(READ, "1")  # the snapshot is taken here
        if attempts == 1:
            await db_pool.execute(APPEND, "1", "theirs;")  # someone else commits meanwhile
        await conn.execute(APPEND, "1", "mine;")
        return attempts

    assert await in_transaction(db_pool, work, what="appending", isolation="repeatable_read") == 2
    assert await db_pool.fetchval(READ, "1") == "theirs;mine;"
    retries = [r.getMessage() for r in caplog.records if "lost a race" in r.getMessage()]
    assert len(retries) == 1
    assert "appending" in retries[0]
    assert "SerializationError" in retries[0]


async def test_a_conflict_on_every_attempt_is_raised_after_the_bound(
    db_pool: asyncpg.Pool,
) -> None:
    attempts = 0

    async def work(conn: Connection) -> None:
        nonlocal attempts
        attempts += 1
        await conn.fetchval(READ, "2")
        await db_pool.execute(APPEND, "2", "theirs;")
        await conn.execute(APPEND, "2", "mine;")

    with pytest.raises(asyncpg.SerializationError):
        await in_transaction(db_pool, work, what="losing", isolation="repeatable_read", attempts=3)
    assert attempts == 3
    assert await db_pool.fetchval(READ, "2") == "theirs;" * 3


async def test_both_sides_of_a_deadlock_complete(
    db_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    locked = {"1": asyncio.Event(), "2": asyncio.Event()}
    attempts = {"1": 0, "2": 0}

    def locking(first: str, second: str) -> Callable[[Connection], Awaitable[None]]:
        async def work(conn: Connection) -> None:
            attempts[first] += 1
            await conn.execute(APPEND, first, f"{first};")
            if attempts[first] == 1:
                locked[first].set()
                await locked[second].wait()
            await conn.execute(APPEND, second, f"{first};")

        return work

    await asyncio.gather(
        in_transaction(db_pool, locking("1", "2"), what="one then two"),
        in_transaction(db_pool, locking("2", "1"), what="two then one"),
    )
    assert sorted(attempts.values()) == [1, 2]  # PostgreSQL aborted one; it ran again
    for flavor in ("1", "2"):
        assert sorted((await db_pool.fetchval(READ, flavor)).split(";")[:-1]) == ["1", "2"]
    assert any("DeadlockDetectedError" in r.getMessage() for r in caplog.records)
