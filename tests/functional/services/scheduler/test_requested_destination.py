"""select_destinations with a requested destination: narrowed and filtered, or forced
and still claimed atomically; and a scheduler too old for it refuses clearly."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.db import allocations, compute_nodes
from shared.exceptions import NoValidHost, ServiceTooOld
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestedDestination, RequestSpec
from tests.functional.services.scheduler.conftest import OpenTransport
from tests.functional.services.scheduler.test_select_destinations import add_host, spec_for

pytestmark = pytest.mark.functional

BIG = FlavorSnapshot(flavorid="2", name="big", vcpus=1, memory_mb=2048, root_gb=1)


def to(node_id: int, *, forced: bool = False, flavor: FlavorSnapshot = BIG) -> RequestSpec:
    destination = RequestedDestination(host="b", node_ids=[node_id], forced=forced)
    return spec_for(flavor).model_copy(update={"requested_destination": destination})


async def used_mb(pool: asyncpg.Pool, node_id: int) -> int:
    async with pool.acquire() as conn:
        return (await compute_nodes.get_by_id(conn, node_id)).memory_mb_used


async def test_the_requested_host_wins_though_it_is_ranked_last(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "a", memory_mb=16384)
    await add_host(db_pool, "c", memory_mb=16384)
    b = await add_host(db_pool, "b", memory_mb=8192)
    for _ in range(3):
        selection = await scheduler.select_destinations(RequestContext(), to(b.id))
        assert selection.compute_node_id == b.id


async def test_a_disabled_down_or_full_requested_host_is_no_valid_host(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "a", memory_mb=16384)
    b = await add_host(db_pool, "b", memory_mb=4096)
    await scheduler.select_destinations(RequestContext(), to(b.id))
    await scheduler.select_destinations(RequestContext(), to(b.id))
    full = to(b.id)
    with pytest.raises(NoValidHost):
        await scheduler.select_destinations(RequestContext(), full)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET disabled = true WHERE id = $1", b.service_id)
    with pytest.raises(NoValidHost):
        await scheduler.select_destinations(RequestContext(), to(b.id, flavor=spec_for().flavor))
    assert await used_mb(db_pool, b.id) == 4096


async def test_forced_skips_the_filters_but_never_over_commits(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "a", memory_mb=16384)
    b = await add_host(db_pool, "b", memory_mb=4096)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET disabled = true WHERE id = $1", b.service_id)
    first = await scheduler.select_destinations(RequestContext(), to(b.id, forced=True))
    assert first.compute_node_id == b.id
    # Two forced requests race for the room of one: exactly one wins.
    results = await asyncio.gather(
        scheduler.select_destinations(RequestContext(), to(b.id, forced=True)),
        scheduler.select_destinations(RequestContext(), to(b.id, forced=True)),
        return_exceptions=True,
    )
    assert sorted(type(r).__name__ for r in results) == ["NoValidHost", "Selection"]
    assert await used_mb(db_pool, b.id) == 4096


async def test_a_repeated_request_gets_its_first_claim(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    b = await add_host(db_pool, "b", memory_mb=8192)
    spec = to(b.id)
    first, second = await asyncio.gather(
        scheduler.select_destinations(RequestContext(), spec),
        scheduler.select_destinations(RequestContext(), spec),
    )
    assert first == second
    async with db_pool.acquire() as conn:
        assert len(await allocations.for_instance(conn, spec.instance_uuid)) == 1
    assert await used_mb(db_pool, b.id) == 2048


async def test_a_scheduler_pinned_below_1_2_refuses_rather_than_drops_it(
    db_pool: asyncpg.Pool, open_transport: OpenTransport
) -> None:
    b = await add_host(db_pool, "b", memory_mb=8192)
    old = SchedulerAPI(await open_transport(), version_cap="1.1", timeout=5)
    with pytest.raises(ServiceTooOld, match="requested destination"):
        await old.select_destinations(RequestContext(), to(b.id))
    assert await used_mb(db_pool, b.id) == 0
