"""Server group policies in select_destinations: checked under the group's lock, in the
transaction that claims, so concurrent members never break them."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared.context import RequestContext
from shared.db import allocations, instances, server_groups
from shared.exceptions import NoValidHost
from shared.objects.instance import RequestedDestination, RequestSpec
from tests.functional.services.scheduler.conftest import OpenTransport, serve_scheduler
from tests.functional.services.scheduler.test_select_destinations import SMALL, add_host

pytestmark = pytest.mark.functional


async def members(
    pool: asyncpg.Pool, policy: str, count: int, rules: dict[str, Any] | None = None
) -> list[UUID]:
    """A server group of ``policy`` with ``count`` new (unplaced) servers in it."""
    made = [uuid.uuid4() for _ in range(count)]
    async with pool.acquire() as conn, conn.transaction():
        group = await server_groups.create(
            conn,
            group_uuid=uuid.uuid4(),
            name="web",
            project_id="p",
            user_id="u",
            policy=policy,
            rules=rules or {},
        )
        for instance_uuid in made:
            await instances.create(
                conn,
                instance_uuid=instance_uuid,
                project_id="p",
                user_id="u",
                display_name=str(instance_uuid),
                flavor=SMALL,
                image_ref="",
                availability_zone=None,
            )
        await server_groups.add_members(conn, group.id, made)
    return made


def spec(instance_uuid: UUID, **extra: Any) -> RequestSpec:
    return RequestSpec(
        instance_uuid=instance_uuid, project_id="p", user_id="u", flavor=SMALL, **extra
    )


async def place_all(
    schedulers: list[SchedulerAPI], wanted: list[UUID]
) -> list[Selection | BaseException]:
    ctx = RequestContext()
    return await asyncio.gather(
        *(
            schedulers[index % len(schedulers)].select_destinations(ctx, spec(instance_uuid))
            for index, instance_uuid in enumerate(wanted)
        ),
        return_exceptions=True,
    )


async def two_schedulers(
    db_pool: asyncpg.Pool, database_url: str, open_transport: OpenTransport
) -> list[SchedulerAPI]:
    """Two scheduler processes' endpoints on one queue, and a client for each caller."""
    await serve_scheduler(db_pool, open_transport)
    await serve_scheduler(db_pool, open_transport)
    return [SchedulerAPI(await open_transport(), timeout=60) for _ in range(2)]


async def test_twenty_concurrent_members_of_an_anti_affinity_group_take_one_host_each(
    db_pool: asyncpg.Pool, database_url: str, open_transport: OpenTransport
) -> None:
    for host in ("h1", "h2", "h3"):
        await add_host(db_pool, host)
    wanted = await members(db_pool, "anti-affinity", 20)
    schedulers = await two_schedulers(db_pool, database_url, open_transport)

    outcomes = await place_all(schedulers, wanted)

    placed = [o for o in outcomes if isinstance(o, Selection)]
    refused = [o for o in outcomes if not isinstance(o, Selection)]
    assert sorted(s.host for s in placed) == ["h1", "h2", "h3"]
    assert len(refused) == 17
    for error in refused:
        assert isinstance(error, NoValidHost)
        assert str(error).startswith("No valid host was found")
        assert "server group web" in str(error)
        assert "anti-affinity" in str(error)
    async with db_pool.acquire() as conn:
        held = await conn.fetchval("SELECT count(*) FROM allocations")
    assert held == 3


async def test_max_server_per_host_lets_that_many_share_a_host(
    db_pool: asyncpg.Pool, database_url: str, open_transport: OpenTransport
) -> None:
    for host in ("h1", "h2", "h3"):
        await add_host(db_pool, host)
    wanted = await members(db_pool, "anti-affinity", 9, {"max_server_per_host": 2})
    schedulers = await two_schedulers(db_pool, database_url, open_transport)

    outcomes = await place_all(schedulers, wanted)

    placed = sorted(o.host for o in outcomes if isinstance(o, Selection))
    assert placed == ["h1", "h1", "h2", "h2", "h3", "h3"]


async def test_concurrent_members_of_an_affinity_group_share_one_host(
    db_pool: asyncpg.Pool, database_url: str, open_transport: OpenTransport
) -> None:
    for host in ("h1", "h2", "h3"):
        await add_host(db_pool, host)
    wanted = await members(db_pool, "affinity", 8)
    schedulers = await two_schedulers(db_pool, database_url, open_transport)

    outcomes = await place_all(schedulers, wanted)

    assert all(isinstance(o, Selection) for o in outcomes)
    assert len({o.host for o in outcomes if isinstance(o, Selection)}) == 1


async def test_a_moving_member_does_not_count_against_itself(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    """A member's move (its migration is the consumer) may go anywhere no other member
    is, and is refused, saying which members hold which hosts, where none is left."""
    await add_host(db_pool, "h1")
    await add_host(db_pool, "h2")
    first, second = await members(db_pool, "anti-affinity", 2)
    ctx = RequestContext()
    one = await scheduler.select_destinations(ctx, spec(first))
    two = await scheduler.select_destinations(ctx, spec(second))
    assert {one.host, two.host} == {"h1", "h2"}

    with pytest.raises(NoValidHost) as refused:
        await scheduler.select_destinations(
            ctx, spec(first, consumer_uuid=uuid.uuid4(), ignore_nodes=[one.compute_node_uuid])
        )
    assert f"Instance {first} cannot be placed" in str(refused.value)
    assert f"{two.host}: {second}" in str(refused.value)

    third = await add_host(db_pool, "h3")
    moved = await scheduler.select_destinations(
        ctx, spec(first, consumer_uuid=uuid.uuid4(), ignore_nodes=[one.compute_node_uuid])
    )
    assert moved.compute_node_id == third.id
    async with db_pool.acquire() as conn:
        held = await allocations.for_instance(conn, first)
    assert sorted(a.compute_node_id for a in held) == sorted([one.compute_node_id, third.id])


async def test_a_forced_destination_still_keeps_the_policy(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    taken = await add_host(db_pool, "h1")
    await add_host(db_pool, "h2")
    first, second = await members(db_pool, "anti-affinity", 2)
    ctx = RequestContext()
    forced = RequestedDestination(host="h1", node_ids=[taken.id], forced=True)
    assert (await scheduler.select_destinations(ctx, spec(first))).host == "h1"

    with pytest.raises(NoValidHost, match="server group web"):
        await scheduler.select_destinations(ctx, spec(second, requested_destination=forced))
