"""Service versions against real PostgreSQL (and RabbitMQ for the conductor's storm)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.conductor.main import run_conductor
from services.conductor.rpcapi import ConductorAPI
from shared.config import RpcSettings, Settings, WorkaroundSettings
from shared.context import RequestContext
from shared.db import services
from shared.exceptions import ServiceNotFound, ServiceTooOld, Unroutable
from shared.metrics import Metrics
from shared.objects.compute_node import NodeResources
from shared.rpc.amqp import AmqpTransport
from shared.runtime import Lifecycle
from shared.version_pins import MinimumVersions, Pins, RpcPin
from shared.versions import SERVICE_VERSION, apis_for
from tests.broker import remove_exchange

pytestmark = pytest.mark.functional

COMPUTE = "keel-compute"
LATEST = apis_for(SERVICE_VERSION).compute
CTX = RequestContext.internal()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def add_service(
    pool: asyncpg.Pool, host: str, version: int, *, binary: str = COMPUTE
) -> None:
    async with pool.acquire() as conn:
        await services.get_or_create(
            conn, host=host, binary=binary, topic="compute", version=version, down_time=60
        )


async def set_version(pool: asyncpg.Pool, host: str, version: int) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET version = $2 WHERE host = $1 AND \"binary\" = 'keel-compute'",
            host,
            version,
        )


async def dump(pool: asyncpg.Pool, *, compute_only: bool = False) -> list[list[asyncpg.Record]]:
    """Every row that matters; with ``compute_only``, services other than compute agents'
    (which heartbeat on their own) are left out."""
    services_of = "WHERE \"binary\" = 'keel-compute'" if compute_only else ""
    async with pool.acquire() as conn:
        return [await conn.fetch(f"SELECT * FROM services {services_of} ORDER BY id")] + [
            await conn.fetch(f"SELECT * FROM {table} ORDER BY id")
            for table in ("compute_nodes", "instances", "allocations")
        ]


async def test_forced_down_and_deleted_old_services_do_not_hold_the_minimum_down(
    db_pool: asyncpg.Pool,
) -> None:
    await add_service(db_pool, "new", SERVICE_VERSION)
    await add_service(db_pool, "forced", 1)
    await add_service(db_pool, "gone", 1)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET forced_down = true WHERE host = 'forced'")
        await conn.execute("UPDATE services SET deleted_at = now() WHERE host = 'gone'")

    minimums = MinimumVersions(db_pool, ttl=60)

    assert await minimums.minimum(COMPUTE) == SERVICE_VERSION


async def test_the_pin_rises_within_one_ttl_after_the_last_old_agent_is_upgraded(
    db_pool: asyncpg.Pool,
) -> None:
    await add_service(db_pool, "a", 1)
    await add_service(db_pool, "b", SERVICE_VERSION)
    clock = Clock()
    pins = pins_of(MinimumVersions(db_pool, ttl=5, clock=clock))
    assert await pins.compute.cap() == "1.0"

    await set_version(db_pool, "a", SERVICE_VERSION)
    clock.now += 4
    assert await pins.compute.cap() == "1.0"
    clock.now += 1
    assert await pins.compute.cap() == LATEST


async def test_with_a_long_ttl_the_pin_rises_only_after_sighup(db_pool: asyncpg.Pool) -> None:
    await add_service(db_pool, "a", 1)
    clock = Clock()
    pins = pins_of(MinimumVersions(db_pool, ttl=3600, clock=clock))
    assert await pins.compute.cap() == "1.0"

    await set_version(db_pool, "a", SERVICE_VERSION)
    clock.now += 3000
    assert await pins.compute.cap() == "1.0"
    await pins.reload(Settings(service_version_cache_ttl=3600))
    assert await pins.compute.cap() == LATEST


def pins_of(minimums: MinimumVersions) -> Pins:
    return Pins(
        minimums,
        RpcPin("compute", "auto", minimums),
        RpcPin("scheduler", "auto", minimums),
        RpcPin("conductor", "auto", minimums),
    )


@pytest.fixture
def conductor_settings(database_url: str, amqp_url: str, exchange: str) -> Settings:
    return Settings(
        database_url=database_url,
        transport_url=amqp_url,
        exchange=exchange,
        host="control",
        report_interval=0.5,
        rpc=RpcSettings(queue_expires=60, call_timeout=30, connect_timeout=10),
    )


@pytest.fixture
async def transport(amqp_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    opened = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
    await opened.connect()
    yield opened
    await opened.close()
    await remove_exchange(exchange, ("conductor",))


async def _serving(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport, metrics: Metrics
) -> tuple[Lifecycle, asyncio.Task[None], ConductorAPI]:
    lifecycle = Lifecycle(metrics=metrics)
    conductor_transport = AmqpTransport.from_settings(settings)
    await conductor_transport.connect()

    async def run() -> None:
        try:
            await run_conductor(settings, lifecycle, db_pool, conductor_transport)
        finally:
            await conductor_transport.close()

    task = asyncio.create_task(run())
    api = ConductorAPI(transport, timeout=30)
    async with asyncio.timeout(20):
        while True:
            if task.done():
                task.result()  # it refused to start: raise why
            try:
                await api.service_heartbeat(CTX, service_uuid=uuid.uuid4(), version=3)
            except Unroutable:
                await asyncio.sleep(0.05)
            except ServiceNotFound:
                return lifecycle, task, api


def resources(host: str) -> NodeResources:
    return NodeResources(
        hypervisor_hostname=host,
        vcpus=8,
        memory_mb=8192,
        local_gb=100,
        cpu_allocation_ratio=1,
        ram_allocation_ratio=1,
        disk_allocation_ratio=1,
    )


async def test_a_storm_of_200_registrations_asks_for_the_minimum_once(
    conductor_settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    metrics = Metrics()
    lifecycle, task, api = await _serving(conductor_settings, db_pool, transport, metrics)
    try:
        await asyncio.gather(
            *(
                api.register_compute(
                    CTX,
                    host=f"sim{n}",
                    node_uuid=uuid.uuid4(),
                    version=SERVICE_VERSION,
                    resources=resources(f"sim{n}"),
                )
                for n in range(200)
            )
        )
    finally:
        lifecycle.stopping.set()
        await task
    asked = metrics.value("keel_min_service_version_queries_total", binary=COMPUTE)
    assert asked == 1
    async with db_pool.acquire() as conn:
        assert await services.version_counts(conn, COMPUTE) == {SERVICE_VERSION: 200}


async def test_an_agent_older_than_the_rest_is_refused_and_nothing_is_written(
    conductor_settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    lifecycle, task, api = await _serving(conductor_settings, db_pool, transport, Metrics())
    try:
        for host in ("a", "b"):
            await api.register_compute(
                CTX,
                host=host,
                node_uuid=uuid.uuid4(),
                version=SERVICE_VERSION,
                resources=resources(host),
            )
        before = await dump(db_pool)

        with pytest.raises(ServiceTooOld) as refused:
            await api.register_compute(
                CTX, host="stale", node_uuid=uuid.uuid4(), version=1, resources=resources("stale")
            )
        with pytest.raises(ServiceTooOld, match=r"older \(v0\) than the minimum \(v1\)"):
            await api.service_heartbeat(CTX, service_uuid=uuid.uuid4(), version=0)
    finally:
        lifecycle.stopping.set()
        await task
    assert refused.value.message == (
        f"This service is older (v1) than the minimum (v{SERVICE_VERSION}) version of the rest "
        "of the deployment. Unable to continue."
    )
    assert await dump(db_pool) == before


async def test_conductor_refuses_to_start_beside_too_old_computes_unless_told(
    conductor_settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await add_service(db_pool, "ancient", 0)
    before = await dump(db_pool)

    with pytest.raises(ServiceTooOld) as refused:
        await _serving(conductor_settings, db_pool, transport, Metrics())

    assert "ancient (v0)" in refused.value.message
    assert "KEEL_WORKAROUNDS__DISABLE_COMPUTE_SERVICE_CHECK_FOR_FFU" in refused.value.message
    assert await dump(db_pool) == before

    caplog.set_level(logging.WARNING, logger="shared.version_checks")
    allowed = conductor_settings.model_copy(
        update={"workarounds": WorkaroundSettings(disable_compute_service_check_for_ffu=True)}
    )
    lifecycle, task, _ = await _serving(allowed, db_pool, transport, Metrics())
    lifecycle.stopping.set()
    await task
    assert any("starts anyway" in r.getMessage() for r in caplog.records)


async def test_keel_api_caps_conductor_rpcs_by_the_oldest_conductor(db_pool: asyncpg.Pool) -> None:
    await add_service(db_pool, "old-controller", 6, binary="keel-conductor")
    await add_service(db_pool, "new-controller", SERVICE_VERSION, binary="keel-conductor")
    pins = pins_of(MinimumVersions(db_pool, ttl=60))
    # Release 6 speaks conductor 1.5: cold migration, but not a requested destination.
    assert await pins.conductor.cap() == "1.5"
    await set_conductor_version(db_pool, "old-controller", SERVICE_VERSION)
    await pins.reload(Settings(service_version_cache_ttl=60))
    assert await pins.conductor.cap() == apis_for(SERVICE_VERSION).conductor


async def set_conductor_version(pool: asyncpg.Pool, host: str, version: int) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET version = $2 WHERE host = $1 AND \"binary\" = 'keel-conductor'",
            host,
            version,
        )


async def force_down(pool: asyncpg.Pool, host: str, down: bool = True) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET forced_down = $2 WHERE host = $1 AND \"binary\" = 'keel-compute'",
            host,
            down,
        )


async def test_an_older_agent_whose_own_row_is_forced_down_is_still_refused(
    conductor_settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """The spec's ancient host returning: its own row (forced down while it was away)
    counts on neither side, so the only other compute, one release newer, is the rest."""
    await add_service(db_pool, "other", SERVICE_VERSION)
    await add_service(db_pool, "returning", SERVICE_VERSION)
    await force_down(db_pool, "returning")
    lifecycle, task, api = await _serving(conductor_settings, db_pool, transport, Metrics())
    try:
        before = await dump(db_pool, compute_only=True)
        with pytest.raises(ServiceTooOld) as refused:
            await api.register_compute(
                CTX,
                host="returning",
                node_uuid=uuid.uuid4(),
                version=SERVICE_VERSION - 1,
                resources=resources("returning"),
            )
    finally:
        lifecycle.stopping.set()
        await task
    assert refused.value.message == (
        f"This service is older (v{SERVICE_VERSION - 1}) than the minimum "
        f"(v{SERVICE_VERSION}) version of the rest of the deployment. Unable to continue."
    )
    assert await dump(db_pool, compute_only=True) == before


async def test_a_stale_cache_never_lets_an_older_agent_in(
    conductor_settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """The conductor cached the counts while the agent's row was forced down; the row was
    then brought back up. The cache (one service) and the row (counted again) disagree:
    the database decides."""
    await add_service(db_pool, "other", SERVICE_VERSION)
    await add_service(db_pool, "returning", SERVICE_VERSION)
    await force_down(db_pool, "returning")
    conductor_settings = conductor_settings.model_copy(update={"service_version_cache_ttl": 3600})
    lifecycle, task, api = await _serving(conductor_settings, db_pool, transport, Metrics())
    try:
        # The other agent restarts: the cache now holds {latest: 1}, without "returning".
        await api.register_compute(
            CTX,
            host="other",
            node_uuid=uuid.uuid4(),
            version=SERVICE_VERSION,
            resources=resources("other"),
        )
        await force_down(db_pool, "returning", False)
        with pytest.raises(ServiceTooOld, match=f"minimum \\(v{SERVICE_VERSION}\\)"):
            await api.register_compute(
                CTX,
                host="returning",
                node_uuid=uuid.uuid4(),
                version=SERVICE_VERSION - 1,
                resources=resources("returning"),
            )
        # Forced-down rows of other hosts never hold the rest down either.
        await add_service(db_pool, "ancient-but-fenced", SERVICE_VERSION - 2)
        await force_down(db_pool, "ancient-but-fenced")
        with pytest.raises(ServiceTooOld, match=f"minimum \\(v{SERVICE_VERSION}\\)"):
            await api.register_compute(
                CTX,
                host="returning",
                node_uuid=uuid.uuid4(),
                version=SERVICE_VERSION - 1,
                resources=resources("returning"),
            )
    finally:
        lifecycle.stopping.set()
        await task
    async with db_pool.acquire() as conn:
        assert await services.counted_version(conn, "returning", COMPUTE) == SERVICE_VERSION


async def test_an_agent_of_the_oldest_release_running_is_accepted_again(
    conductor_settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    """A peer of its release is up; a newer service is forced down and does not count."""
    await add_service(db_pool, "peer", SERVICE_VERSION - 1)
    await add_service(db_pool, "newer-but-fenced", SERVICE_VERSION)
    await force_down(db_pool, "newer-but-fenced")
    node_uuid = uuid.uuid4()
    lifecycle, task, api = await _serving(conductor_settings, db_pool, transport, Metrics())
    try:
        for _ in range(2):
            await api.register_compute(
                CTX,
                host="returning",
                node_uuid=node_uuid,
                version=SERVICE_VERSION - 1,
                resources=resources("returning"),
            )
    finally:
        lifecycle.stopping.set()
        await task
    async with db_pool.acquire() as conn:
        assert await services.version_counts(conn, COMPUTE) == {SERVICE_VERSION - 1: 2}
