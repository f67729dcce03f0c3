"""The orphaned-guest records of a node: what its agent found last, and since when."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from shared.db import orphans

pytestmark = pytest.mark.functional


async def a_node(pool: asyncpg.Pool, host: str) -> int:
    async with pool.acquire() as conn:
        node_id: int = await conn.fetchval(
            """INSERT INTO compute_nodes (uuid, host, hypervisor_hostname, vcpus, memory_mb,
                                          local_gb)
               VALUES ($1, $2, $2, 4, 4096, 40) RETURNING id""",
            uuid.uuid4(),
            host,
        )
    return node_id


async def recorded(pool: asyncpg.Pool, node_id: int) -> dict[uuid.UUID, tuple[str, bool]]:
    """Each guest's reason, and whether it was seen after it was first seen."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT instance_uuid, reason, last_seen > first_seen AS again
                 FROM orphaned_guests WHERE compute_node_id = $1""",
            node_id,
        )
    return {r["instance_uuid"]: (r["reason"], r["again"]) for r in rows}


async def report(pool: asyncpg.Pool, node_id: int, found: list[tuple[uuid.UUID, str]]) -> None:
    async with pool.acquire() as conn:
        await orphans.report(conn, node_id, found)


async def test_a_report_records_what_was_found_and_forgets_the_rest(db_pool: asyncpg.Pool) -> None:
    node, other = await a_node(db_pool, "or-a"), await a_node(db_pool, "or-b")
    x, y, z = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await report(db_pool, node, [(x, "no server"), (y, "no server")])
    await report(db_pool, other, [(z, "elsewhere")])
    assert await recorded(db_pool, node) == {x: ("no server", False), y: ("no server", False)}

    # Found again with a new reason; y no longer found; a guest named twice counts once.
    await report(db_pool, node, [(x, "first"), (x, "moved away"), (z, "new")])
    assert await recorded(db_pool, node) == {x: ("moved away", True), z: ("new", False)}
    # Another node's records are its own.
    assert await recorded(db_pool, other) == {z: ("elsewhere", False)}

    await report(db_pool, node, [])
    assert await recorded(db_pool, node) == {}
    assert await recorded(db_pool, other) == {z: ("elsewhere", False)}


async def test_the_same_report_twice_at_once_records_it_once(db_pool: asyncpg.Pool) -> None:
    node = await a_node(db_pool, "or-c")
    stale = uuid.uuid4()
    await report(db_pool, node, [(stale, "gone since")])
    found = [(uuid.uuid4(), f"guest {i}") for i in range(20)]

    await asyncio.gather(report(db_pool, node, found), report(db_pool, node, found))

    assert {g: reason for g, (reason, _) in (await recorded(db_pool, node)).items()} == dict(found)
