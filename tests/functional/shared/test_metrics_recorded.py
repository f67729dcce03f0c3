"""What the dashboard's metrics count, against real PostgreSQL: boots, SQL commands, the
fleet gauges keel-api keeps; each counted once however often its event is delivered, and
not at all when its database work failed.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.api.fleet_metrics import FleetGauges
from services.compute.rpcapi import ComputeAPI
from services.conductor.manager import ConductorManager
from services.conductor.rpcapi import InstanceBuildResult
from services.scheduler.rpcapi import SchedulerAPI
from shared.config import DatabaseSettings, Settings
from shared.context import RequestContext
from shared.db import compute_nodes, instances, services
from shared.db.pool import create_pool, query_verb
from shared.metrics import Metrics
from shared.objects.compute_node import NodeResources
from shared.rpc.fake import FakeTransport
from shared.versions import SERVICE_VERSION
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.conductor.stand_in import create_instance

pytestmark = pytest.mark.functional

OUTAGE = DatabaseSettings(connect_timeout=5, acquire_timeout=1, command_timeout=2)


def manager(pool: asyncpg.Pool, metrics: Metrics) -> ConductorManager:
    transport = FakeTransport()
    return ConductorManager(
        pool,
        SchedulerAPI(transport),
        ComputeAPI(transport),
        service_down_time=60,
        metrics=metrics,
    )


async def spawning(pool: asyncpg.Pool) -> UUID:
    """An instance whose guest is being spawned, as the conductor leaves it for its agent."""
    instance_uuid = await create_instance(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET task_state = 'spawning',
                      created_at = now() - interval '3 seconds' WHERE uuid = $1""",
            instance_uuid,
        )
    return instance_uuid


async def test_a_boot_reported_twice_at_once_is_counted_once(db_pool: asyncpg.Pool) -> None:
    metrics = Metrics()
    conductor = manager(db_pool, metrics)
    ok, failed = await spawning(db_pool), await spawning(db_pool)
    ctx = RequestContext()

    await asyncio.gather(
        conductor.instance_build_result(ctx, InstanceBuildResult(instance_uuid=ok, success=True)),
        conductor.instance_build_result(ctx, InstanceBuildResult(instance_uuid=ok, success=True)),
    )
    bad = InstanceBuildResult(instance_uuid=failed, success=False, message="disk image corrupt")
    await asyncio.gather(
        conductor.instance_build_result(ctx, bad), conductor.instance_build_result(ctx, bad)
    )

    assert metrics.value("keel_boots_total", result="active") == 1
    assert metrics.value("keel_boots_total", result="error") == 1
    assert metrics.value("keel_boot_seconds_count") == 1
    assert 3 <= metrics.value("keel_boot_seconds_sum") < 60


async def test_a_boot_whose_database_write_failed_is_not_counted(
    db_pool: asyncpg.Pool, database_url: str, pg_proxy: TcpProxy
) -> None:
    metrics = Metrics()
    instance_uuid = await spawning(db_pool)
    pool = await create_pool(url_through(database_url, pg_proxy.address), OUTAGE)
    try:
        conductor = manager(pool, metrics)
        result = InstanceBuildResult(instance_uuid=instance_uuid, success=True)
        await pg_proxy.cut()
        with pytest.raises((OSError, asyncpg.PostgresError, TimeoutError)):
            await conductor.instance_build_result(RequestContext(), result)
        assert metrics.value("keel_boots_total", result="active") == 0
        await pg_proxy.restore()
        await conductor.instance_build_result(RequestContext(), result)  # redelivered
    finally:
        pool.terminate()
    assert metrics.value("keel_boots_total", result="active") == 1
    async with db_pool.acquire() as conn:
        assert (await instances.get(conn, instance_uuid)).vm_state == "active"


async def test_every_sql_command_of_a_timed_pool_is_counted_by_verb(database_url: str) -> None:
    metrics = Metrics()
    pool = await create_pool(database_url, DatabaseSettings(), metrics)
    try:
        async with pool.acquire() as conn:
            await conn.fetchval("SELECT 1")
            await conn.fetchval("  select $1::int", 2)
            await conn.execute("CREATE TEMP TABLE t (x int)")
            await conn.execute("INSERT INTO t VALUES (1)")
        await asyncio.sleep(0)  # the query logger is called soon after each command
    finally:
        await pool.close()
    assert metrics.value("keel_db_query_seconds_count", verb="select") >= 2
    assert metrics.value("keel_db_query_seconds_count", verb="insert") == 1
    assert metrics.value("keel_db_query_seconds_count", verb="other") >= 1
    assert query_verb("WITH x AS (SELECT 1) SELECT * FROM x") == "with"
    assert query_verb("   ") == "other"


async def add_host(pool: asyncpg.Pool, host: str, *, silent: float, forced: bool = False) -> int:
    async with pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host=host, binary="keel-compute", topic="compute", version=1, down_time=10
        )
        await conn.execute(
            """UPDATE services
                  SET version = $2, self_fence_after = 20, fence_lease = 20,
                      forced_down = $3, disabled = $3,
                      last_seen_up = now() - make_interval(secs => $4)
                WHERE id = $1""",
            service.id,
            SERVICE_VERSION,
            forced,
            silent,
        )
        node = await compute_nodes.upsert(
            conn,
            node_uuid=UUID(int=service.id),
            service_id=service.id,
            host=host,
            resources=NodeResources(
                hypervisor_hostname=host, vcpus=4, memory_mb=4096, local_gb=40,
                cpu_allocation_ratio=1.0, ram_allocation_ratio=1.0, disk_allocation_ratio=1.0,
                availability_zone="nova",
            ),
        )  # fmt: skip
    return node.id


async def test_fleet_gauges_count_hosts_servers_and_moves(
    db_pool: asyncpg.Pool, database_url: str
) -> None:
    await add_host(db_pool, "up", silent=0)
    await add_host(db_pool, "down", silent=15)
    await add_host(db_pool, "fenced", silent=20 + 30 + 1)  # its lease + the margin
    await add_host(db_pool, "forced", silent=0, forced=True)
    building = await create_instance(db_pool)
    metrics = Metrics()
    gauges = FleetGauges(
        db_pool,
        Settings(database_url=database_url, service_down_time=10, report_interval=2),
        metrics,
    )

    await asyncio.gather(gauges.refresh(), gauges.refresh())

    for state in ("up", "down", "fenced", "forced_down"):
        assert metrics.value("keel_compute_hosts", state=state) == 1, state
    assert metrics.value("keel_compute_hosts_disabled") == 1
    assert metrics.value("keel_servers", status="BUILD") == 1

    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET vm_state = 'error' WHERE uuid = $1", building)
    await gauges.refresh()
    assert metrics.value("keel_servers", status="BUILD") == 0  # dropped, not left stale
    assert metrics.value("keel_servers", status="ERROR") == 1


async def test_fleet_gauges_keep_their_values_when_the_database_is_away(
    db_pool: asyncpg.Pool, database_url: str, pg_proxy: TcpProxy
) -> None:
    await add_host(db_pool, "up", silent=0)
    metrics = Metrics()
    pool = await create_pool(url_through(database_url, pg_proxy.address), OUTAGE)
    settings = Settings(database_url=database_url, service_down_time=10, report_interval=2)
    try:
        gauges = FleetGauges(pool, settings, metrics)
        await gauges.refresh()
        await pg_proxy.cut()
        with pytest.raises((OSError, asyncpg.PostgresError, TimeoutError)):
            await gauges.refresh()
        assert metrics.value("keel_compute_hosts", state="up") == 1
    finally:
        pool.terminate()
