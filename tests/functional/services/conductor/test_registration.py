"""Agent registration and heartbeats through the conductor, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, services
from shared.exceptions import DuplicateComputeNode, HostRenameDetected, ServiceNotFound
from shared.versions import SELF_FENCING_VERSION, SERVICE_VERSION
from tests.functional.services.conductor.stand_in import SMALL, resources

pytestmark = pytest.mark.functional

CTX = RequestContext.internal()


async def snapshot(pool: asyncpg.Pool) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    async with pool.acquire() as conn:
        return (
            await conn.fetch("SELECT * FROM services ORDER BY id"),
            await conn.fetch("SELECT * FROM compute_nodes ORDER BY id"),
        )


async def compute_rows(pool: asyncpg.Pool, host: str) -> tuple[int, int]:
    async with pool.acquire() as conn:
        service_count: int = await conn.fetchval(
            "SELECT count(*) FROM services WHERE host = $1 AND \"binary\" = 'keel-compute'", host
        )
        node_count: int = await conn.fetchval(
            "SELECT count(*) FROM compute_nodes WHERE host = $1", host
        )
    return service_count, node_count


async def test_register_compute_creates_service_and_node_and_is_idempotent(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    node_uuid = uuid.uuid4()
    first = await conductor.register_compute(
        CTX, host="cn1", node_uuid=node_uuid, version=SERVICE_VERSION, resources=resources("cn1")
    )
    again = await conductor.register_compute(
        CTX, host="cn1", node_uuid=node_uuid, version=SERVICE_VERSION, resources=resources("cn1")
    )

    assert again == first
    assert first.node_uuid == node_uuid
    assert await compute_rows(db_pool, "cn1") == (1, 1)
    async with db_pool.acquire() as conn:
        service = await services.get(conn, first.service_uuid, 60)
        node = await compute_nodes.get_by_uuid(conn, node_uuid)
    assert (service.host, service.binary, service.topic) == ("cn1", "keel-compute", "compute")
    # Up only once the agent heartbeats, which it does after consuming its queue.
    assert not service.is_up
    assert service.version == SERVICE_VERSION
    await conductor.service_heartbeat(CTX, service_uuid=first.service_uuid, version=SERVICE_VERSION)
    async with db_pool.acquire() as conn:
        assert (await services.get(conn, first.service_uuid, 60)).is_up
    assert (node.id, node.service_id, node.hypervisor_hostname) == (
        first.node_id,
        first.service_id,
        "cn1",
    )
    assert (node.vcpus, node.memory_mb, node.local_gb) == (4, 2048, 50)


async def test_node_of_another_host_is_refused_and_nothing_changes(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    node_uuid = uuid.uuid4()
    await conductor.register_compute(
        CTX, host="old-name", node_uuid=node_uuid, version=SERVICE_VERSION, resources=resources("n")
    )
    before = await snapshot(db_pool)

    with pytest.raises(HostRenameDetected) as caught:
        await conductor.register_compute(
            CTX,
            host="new-name",
            node_uuid=node_uuid,
            version=SERVICE_VERSION,
            resources=resources("n"),
        )

    message = str(caught.value)
    assert str(node_uuid) in message
    assert "'old-name'" in message
    assert "'new-name'" in message
    assert await snapshot(db_pool) == before
    assert await compute_rows(db_pool, "new-name") == (0, 0)


async def test_host_presenting_a_new_node_uuid_for_its_node_is_refused(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    known = uuid.uuid4()
    await conductor.register_compute(
        CTX, host="cn1", node_uuid=known, version=SERVICE_VERSION, resources=resources("cn1")
    )
    before = await snapshot(db_pool)

    with pytest.raises(DuplicateComputeNode, match=str(known)):
        await conductor.register_compute(
            CTX,
            host="cn1",
            node_uuid=uuid.uuid4(),
            version=SERVICE_VERSION,
            resources=resources("cn1"),
        )

    assert await snapshot(db_pool) == before


async def test_heartbeat_updates_liveness_version_and_totals_not_usage(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    registration = await conductor.register_compute(
        CTX, host="cn1", node_uuid=uuid.uuid4(), version=SERVICE_VERSION, resources=resources("cn1")
    )
    async with db_pool.acquire() as conn:
        assert await allocations.claim(conn, registration.node_id, uuid.uuid4(), SMALL)
        await conn.execute(
            """UPDATE services SET last_seen_up = now() - interval '1 hour', version = 0
                WHERE uuid = $1""",
            registration.service_uuid,
        )
        stale = await services.get(conn, registration.service_uuid, 60)
    assert not stale.is_up

    await conductor.service_heartbeat(
        CTX,
        service_uuid=registration.service_uuid,
        version=SERVICE_VERSION,
        node_uuid=registration.node_uuid,
        resources=resources("cn1", memory_mb=8192),
    )

    async with db_pool.acquire() as conn:
        fresh = await services.get(conn, registration.service_uuid, 60)
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
    assert fresh.is_up
    assert stale.last_seen_up is not None
    assert fresh.last_seen_up is not None
    assert fresh.last_seen_up > stale.last_seen_up
    assert fresh.version == SERVICE_VERSION
    assert fresh.report_count == stale.report_count + 1
    assert node.memory_mb == 8192
    assert node.memory_mb_used == SMALL.memory_mb


async def test_heartbeat_without_resources_only_stamps_liveness(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    registration = await conductor.register_compute(
        CTX, host="cn1", node_uuid=uuid.uuid4(), version=SERVICE_VERSION, resources=resources("cn1")
    )
    before = await snapshot(db_pool)
    await conductor.service_heartbeat(
        CTX, service_uuid=registration.service_uuid, version=SERVICE_VERSION
    )
    after = await snapshot(db_pool)
    assert after[1] == before[1]
    assert [r["report_count"] for r in after[0]] != [r["report_count"] for r in before[0]]


async def test_heartbeats_without_resources_twice_at_once_both_count(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    registration = await conductor.register_compute(
        CTX, host="cn1", node_uuid=uuid.uuid4(), version=SERVICE_VERSION, resources=resources("cn1")
    )
    before = await snapshot(db_pool)
    beat = conductor.service_heartbeat
    service = registration.service_uuid
    await asyncio.gather(
        beat(CTX, service_uuid=service, version=SERVICE_VERSION, fence_lease=30.0),
        beat(CTX, service_uuid=service, version=SERVICE_VERSION, fence_lease=30.0),
    )
    after = await snapshot(db_pool)
    assert after[1] == before[1]
    counts = {r["uuid"]: r["report_count"] for r in before[0]}
    (row,) = [r for r in after[0] if r["uuid"] == service]
    assert row["report_count"] == counts[service] + 2
    assert row["fence_lease"] == 30.0


async def test_heartbeat_of_unknown_service_is_service_not_found(conductor: ConductorAPI) -> None:
    with pytest.raises(ServiceNotFound):
        await conductor.service_heartbeat(CTX, service_uuid=uuid.uuid4(), version=SERVICE_VERSION)


async def test_conductor_and_scheduler_keep_their_own_rows_up(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    async with db_pool.acquire() as conn:
        rows = await services.list_services(conn, 60, host="control-host")
    assert sorted((r.binary, r.topic, r.is_up) for r in rows) == [
        ("keel-conductor", "conductor", True),
        ("keel-scheduler", "scheduler", True),
    ]


async def fence_window(pool: asyncpg.Pool, host: str) -> float | None:
    async with pool.acquire() as conn:
        window: float | None = await conn.fetchval(
            """SELECT self_fence_after FROM services
                WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
            host,
        )
    return window


async def test_the_agents_self_fence_window_is_recorded_as_it_last_reported_it(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    node_uuid = uuid.uuid4()
    registered = await conductor.register_compute(
        CTX,
        host="cn-f",
        node_uuid=node_uuid,
        version=SERVICE_VERSION,
        resources=resources("cn-f"),
        self_fence_after=12.5,
    )
    assert await fence_window(db_pool, "cn-f") == 12.5

    beats = [
        conductor.service_heartbeat(
            CTX, service_uuid=registered.service_uuid, version=SERVICE_VERSION, self_fence_after=0
        )
        for _ in range(2)
    ]
    await asyncio.gather(*beats)
    assert await fence_window(db_pool, "cn-f") == 0

    # The same host restarted as a release that does not report it: unknown again.
    await conductor.service_heartbeat(
        CTX, service_uuid=registered.service_uuid, version=SELF_FENCING_VERSION - 1
    )
    assert await fence_window(db_pool, "cn-f") is None


async def fence_lease(pool: asyncpg.Pool, host: str) -> float | None:
    async with pool.acquire() as conn:
        lease: float | None = await conn.fetchval(
            """SELECT fence_lease FROM services
                WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
            host,
        )
    return lease


async def test_the_lease_of_the_hosts_armed_fence_is_recorded_as_the_last_heartbeat_said(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    registered = await conductor.register_compute(
        CTX,
        host="cn-l",
        node_uuid=uuid.uuid4(),
        version=SERVICE_VERSION,
        resources=resources("cn-l"),
    )
    assert await fence_lease(db_pool, "cn-l") is None, "armed only once a heartbeat says so"

    beats = [
        conductor.service_heartbeat(
            CTX, service_uuid=registered.service_uuid, version=SERVICE_VERSION, fence_lease=90.0
        )
        for _ in range(2)
    ]
    await asyncio.gather(*beats)
    assert await fence_lease(db_pool, "cn-l") == 90.0

    # Its fence died: the next heartbeat reports none, and the host is unarmed again.
    await conductor.service_heartbeat(
        CTX, service_uuid=registered.service_uuid, version=SERVICE_VERSION
    )
    assert await fence_lease(db_pool, "cn-l") is None
