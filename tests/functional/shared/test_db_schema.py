"""The schema runner and the atomic claim, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from shared.db import allocations, compute_nodes, schema, services
from shared.objects.compute_node import NodeResources
from shared.objects.flavor import FlavorSnapshot

pytestmark = pytest.mark.functional


async def test_sync_is_idempotent_and_concurrent_runs_do_not_race(database_url: str) -> None:
    conns = [await asyncpg.connect(database_url) for _ in range(3)]
    try:
        results = await asyncio.gather(*(schema.sync(c) for c in conns))
        assert all(r == [] for r in results)
        assert await schema.pending(conns[0]) == []
        count = await conns[0].fetchval("SELECT count(*) FROM flavors")
        assert count == 5
    finally:
        for c in conns:
            await c.close()


async def test_concurrent_claims_never_overcommit(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host="h1", binary="keel-compute", topic="compute", version=1, down_time=60
        )
        node = await compute_nodes.upsert(
            conn,
            node_uuid=uuid.uuid4(),
            service_id=service.id,
            host="h1",
            resources=NodeResources(
                hypervisor_hostname="h1",
                vcpus=4,
                memory_mb=4096,
                local_gb=100,
                cpu_allocation_ratio=1.0,
                ram_allocation_ratio=1.0,
                disk_allocation_ratio=1.0,
            ),
        )
    flavor = FlavorSnapshot(flavorid="1", name="one", vcpus=1, memory_mb=512, root_gb=1)

    async def claim_one() -> bool:
        async with db_pool.acquire() as conn:
            return await allocations.claim(conn, node.id, uuid.uuid4(), flavor)

    won = await asyncio.gather(*(claim_one() for _ in range(10)))
    assert won.count(True) == 4
    async with db_pool.acquire() as conn:
        fresh = await compute_nodes.get_by_uuid(conn, node.uuid)
    assert fresh.vcpus_used == 4
    assert fresh.memory_mb_used == 2048
