"""select_destinations over real RabbitMQ, with host state and claims in real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared.config import DatabaseSettings
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instances, services
from shared.db.pool import create_pool
from shared.exceptions import InstanceNotFound, NoValidHost
from shared.objects.compute_node import ComputeNode, NodeResources
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from tests.functional.services.conductor.stand_in import create_instance
from tests.functional.services.scheduler.conftest import OpenTransport, serve_scheduler

pytestmark = pytest.mark.functional

SMALL = FlavorSnapshot(flavorid="1", name="small", vcpus=1, memory_mb=512, root_gb=1)


async def add_host(
    pool: asyncpg.Pool, host: str, *, memory_mb: int = 4096, vcpus: int = 64, local_gb: int = 500
) -> ComputeNode:
    """A compute host as registration leaves it: service heartbeating, node reported."""
    async with pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host=host, binary="keel-compute", topic="compute", version=1, down_time=60
        )
        await services.heartbeat(conn, service.uuid, 1)
        return await compute_nodes.upsert(
            conn,
            node_uuid=uuid.uuid4(),
            service_id=service.id,
            host=host,
            resources=NodeResources(
                hypervisor_hostname=f"{host}.node",
                vcpus=vcpus,
                memory_mb=memory_mb,
                local_gb=local_gb,
                cpu_allocation_ratio=1.0,
                ram_allocation_ratio=1.0,
                disk_allocation_ratio=1.0,
            ),
        )


def spec_for(flavor: FlavorSnapshot = SMALL) -> RequestSpec:
    return RequestSpec(instance_uuid=uuid.uuid4(), project_id="p", user_id="u", flavor=flavor)


async def allocation_count(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM allocations")
    return count


async def test_picks_the_host_with_most_free_ram_and_claims_it(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "small", memory_mb=2048)
    big = await add_host(db_pool, "big", memory_mb=8192)
    await add_host(db_pool, "medium", memory_mb=4096)
    spec = spec_for()

    selection = await scheduler.select_destinations(RequestContext(), spec)

    assert selection.host == "big"
    assert selection.nodename == "big.node"
    assert selection.compute_node_id == big.id
    assert selection.compute_node_uuid == big.uuid
    async with db_pool.acquire() as conn:
        service = await services.get_by_id(conn, big.service_id or 0, 60)
        held = await allocations.for_instance(conn, spec.instance_uuid)
        node = await compute_nodes.get_by_uuid(conn, big.uuid)
    assert selection.service_uuid == service.uuid
    assert [(a.compute_node_id, a.memory_mb) for a in held] == [(big.id, 512)]
    assert (node.vcpus_used, node.memory_mb_used, node.local_gb_used) == (1, 512, 1)


async def test_next_request_spreads_to_the_next_emptiest_host(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "a", memory_mb=4096)
    await add_host(db_pool, "b", memory_mb=3840)
    ctx = RequestContext()
    first = await scheduler.select_destinations(ctx, spec_for())
    second = await scheduler.select_destinations(ctx, spec_for())
    assert (first.host, second.host) == ("a", "b")


async def test_flavor_too_big_is_no_valid_host_and_claims_nothing(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "h1", memory_mb=4096)
    await add_host(db_pool, "h2", memory_mb=8192)
    huge = FlavorSnapshot(flavorid="9", name="huge", vcpus=1, memory_mb=16384, root_gb=1)

    with pytest.raises(NoValidHost, match=r"^No valid host was found"):
        await scheduler.select_destinations(RequestContext(), spec_for(huge))

    assert await allocation_count(db_pool) == 0
    async with db_pool.acquire() as conn:
        used = await conn.fetchval("SELECT sum(memory_mb_used) FROM compute_nodes")
    assert used == 0


async def test_disabled_down_and_forced_down_hosts_are_skipped(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    # The unusable hosts have the most free RAM, so only the filters keep them out.
    await add_host(db_pool, "disabled", memory_mb=16384)
    await add_host(db_pool, "forced-down", memory_mb=16384)
    await add_host(db_pool, "down", memory_mb=16384)
    ok = await add_host(db_pool, "ok", memory_mb=2048)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET disabled = true WHERE host = 'disabled'")
        await conn.execute("UPDATE services SET forced_down = true WHERE host = 'forced-down'")
        await conn.execute(
            "UPDATE services SET last_seen_up = now() - interval '1 hour' WHERE host = 'down'"
        )

    selection = await scheduler.select_destinations(RequestContext(), spec_for())
    assert selection.host == "ok"

    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET disabled = true WHERE id = $1", ok.service_id)
    spec = spec_for()
    with pytest.raises(NoValidHost):
        await scheduler.select_destinations(RequestContext(), spec)
    async with db_pool.acquire() as conn:
        assert await allocations.for_instance(conn, spec.instance_uuid) == []


async def test_availability_zone_and_ignored_hosts_are_honoured(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "west-big", memory_mb=8192)
    await add_host(db_pool, "east", memory_mb=4096)
    ignored = await add_host(db_pool, "east-ignored", memory_mb=8192)
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE compute_nodes SET availability_zone = 'east' WHERE host LIKE 'east%'"
        )
    spec = spec_for().model_copy(
        update={"availability_zone": "east", "ignore_nodes": [ignored.uuid]}
    )
    selection = await scheduler.select_destinations(RequestContext(), spec)
    assert selection.host == "east"


async def test_two_schedulers_racing_never_overcommit(
    database_url: str, db_pool: asyncpg.Pool, open_transport: OpenTransport
) -> None:
    # Two hosts with room for five small instances each (RAM is the limit): ten fit.
    nodes = [await add_host(db_pool, name, memory_mb=5 * 512) for name in ("h1", "h2")]
    pools = [await create_pool(database_url, DatabaseSettings(connect_timeout=5)) for _ in "ab"]
    servers = [await serve_scheduler(pool, open_transport) for pool in pools]
    client = SchedulerAPI(await open_transport(), timeout=30)
    ctx = RequestContext()

    async def select() -> Selection | NoValidHost:
        try:
            return await client.select_destinations(ctx, spec_for())
        except NoValidHost as exc:
            return exc

    try:
        outcomes = await asyncio.gather(*(select() for _ in range(30)))
    finally:
        for server in servers:
            await server.stop(drain_timeout=10)
        for pool in pools:
            await pool.close()

    chosen = [o for o in outcomes if isinstance(o, Selection)]
    assert len(chosen) == 10
    assert sum(isinstance(o, NoValidHost) for o in outcomes) == 20
    assert await allocation_count(db_pool) == 10
    async with db_pool.acquire() as conn:
        for node in nodes:
            fresh = await compute_nodes.get_by_uuid(conn, node.uuid)
            assert fresh.memory_mb_used == 5 * 512
            assert fresh.memory_mb_used <= fresh.memory_mb * fresh.ram_allocation_ratio
    assert sorted(s.host for s in chosen) == ["h1"] * 5 + ["h2"] * 5


async def test_a_deleted_instance_is_never_claimed_for(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    """A request that reaches the scheduler after its server was deleted (its caller
    gone: nothing would release a claim) claims nothing."""
    await add_host(db_pool, "h1")
    server = await create_instance(db_pool)
    async with db_pool.acquire() as conn:
        await instances.soft_delete(conn, server)
    spec = RequestSpec(instance_uuid=server, project_id="p", user_id="u", flavor=SMALL)

    with pytest.raises(InstanceNotFound, match="was deleted before it was placed"):
        await scheduler.select_destinations(RequestContext(), spec)

    assert await allocation_count(db_pool) == 0


async def test_a_delete_under_way_is_waited_for_and_its_server_not_claimed_for(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    """Finding 52: a delete and a late scheduling request at once. The delete holds the
    server's row while it releases its claims; the request waits for it, then finds the
    server deleted and claims nothing, so no claim is left that nothing releases."""
    await add_host(db_pool, "h1")
    server = await create_instance(db_pool)
    spec = RequestSpec(instance_uuid=server, project_id="p", user_id="u", flavor=SMALL)
    async with db_pool.acquire() as conn, conn.transaction():
        await instances.soft_delete(conn, server)
        placing = asyncio.create_task(scheduler.select_destinations(RequestContext(), spec))
        await asyncio.sleep(0.3)
        waited = not placing.done()
        await allocations.release_instance(conn, server)
    with pytest.raises(InstanceNotFound):
        await placing

    assert waited
    assert await allocation_count(db_pool) == 0


async def test_a_claim_that_loses_a_deadlock_with_a_delete_is_made_again(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    """A delete releases the server's claims (holding their node) before it marks the
    server's row; the scheduler holds that row while it claims on the same node.
    PostgreSQL aborts the scheduler's transaction, which waited first; the RPC server
    runs the handler again on that transient failure, which waits for the delete, finds
    the server deleted and claims nothing."""
    node = await add_host(db_pool, "h1")
    server = await create_instance(db_pool)
    spec = RequestSpec(instance_uuid=server, project_id="p", user_id="u", flavor=SMALL)
    async with db_pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM compute_nodes WHERE id = $1 FOR UPDATE", node.id)
        placing = asyncio.create_task(scheduler.select_destinations(RequestContext(), spec))
        await asyncio.sleep(0.3)
        assert not placing.done()
        await instances.soft_delete(conn, server)
    with pytest.raises(InstanceNotFound, match="was deleted before it was placed"):
        await placing

    assert await allocation_count(db_pool) == 0
