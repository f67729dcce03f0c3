"""Aggregate metadata in select_destinations: flavors matched against it, hosts set aside
for projects, and zones taken from it."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.db import aggregates
from shared.exceptions import NoValidHost
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from tests.functional.services.scheduler.test_select_destinations import SMALL, add_host

pytestmark = pytest.mark.functional


async def aggregate(pool: asyncpg.Pool, hosts: list[str], metadata: dict[str, str | None]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        made = await aggregates.create(conn, uuid=uuid.uuid4(), name=str(uuid.uuid4()), zone=None)
        ids = [
            await conn.fetchval("SELECT id FROM services WHERE host = $1", host) for host in hosts
        ]
        for service_id in ids:
            await aggregates.add_host(conn, made.id, service_id)
        await aggregates.set_metadata(conn, made.id, metadata)
        await aggregates.sync_zones(conn, ids)


def spec(flavor: FlavorSnapshot = SMALL, **extra: object) -> RequestSpec:
    return RequestSpec.model_validate(
        {"instance_uuid": uuid.uuid4(), "project_id": "p", "user_id": "u", "flavor": flavor} | extra
    )


async def test_scoped_extra_specs_must_match_the_hosts_aggregates(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "big", memory_mb=8192)
    await add_host(db_pool, "ssd", memory_mb=2048)
    await aggregate(db_pool, ["ssd"], {"disk": "ssd", "gen": "3"})
    wants_ssd = SMALL.model_copy(
        update={"extra_specs": {"aggregate_instance_extra_specs:disk": "ssd", "hw:x": "1"}}
    )
    newer = SMALL.model_copy(update={"extra_specs": {"aggregate_instance_extra_specs:gen": ">= 2"}})
    ctx = RequestContext()
    assert (await scheduler.select_destinations(ctx, spec(wants_ssd))).host == "ssd"
    assert (await scheduler.select_destinations(ctx, spec(newer))).host == "ssd"
    assert (await scheduler.select_destinations(ctx, spec())).host == "big"
    nowhere = SMALL.model_copy(
        update={"extra_specs": {"aggregate_instance_extra_specs:disk": "<or> nvme <or> tape"}}
    )
    with pytest.raises(NoValidHost):
        await scheduler.select_destinations(ctx, spec(nowhere))


async def test_hosts_set_aside_for_projects_take_only_theirs(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "reserved", memory_mb=8192)
    await add_host(db_pool, "open", memory_mb=2048)
    await aggregate(db_pool, ["reserved"], {"filter_tenant_id": "gold, platinum"})
    ctx = RequestContext()
    assert (await scheduler.select_destinations(ctx, spec())).host == "open"
    gold = spec(project_id="gold")
    assert (await scheduler.select_destinations(ctx, gold)).host == "reserved"


async def test_a_zone_from_an_aggregate_is_where_a_zoned_request_goes(
    db_pool: asyncpg.Pool, scheduler: SchedulerAPI
) -> None:
    await add_host(db_pool, "a", memory_mb=8192)
    await add_host(db_pool, "b", memory_mb=2048)
    await aggregate(db_pool, ["b"], {"availability_zone": "east"})
    ctx = RequestContext()
    assert (await scheduler.select_destinations(ctx, spec(availability_zone="east"))).host == "b"
    assert (await scheduler.select_destinations(ctx, spec(availability_zone="nova"))).host == "a"
