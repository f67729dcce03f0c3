"""Soft delete, restore, forceDelete and the reclaim, on real PostgreSQL and RabbitMQ.

As in Nova, a soft-deleted server shows (status SOFT_DELETED) but is listed only among
the deleted ones (``deleted=true``) or with ``soft_deleted=true`` (admins).

keel-api in-process, a running keel-conductor (its main) and a compute agent
(:class:`ComputeManager` over the fake driver) consuming its own topic: a DELETE with
``KEEL_RECLAIM_INSTANCE_INTERVAL`` set goes all the way to the guest and back.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.manager import ComputeManager
from services.compute.rpcapi import RPC_VERSION as COMPUTE_RPC_VERSION
from services.compute.rpcapi import ComputeAPI, topic_for
from services.compute.virt.fake import FakeDriver
from services.conductor.main import serve as serve_conductor
from services.conductor.reclaim import RECLAIM_USER, SoftDeleteReclaim
from services.conductor.rpcapi import RPC_VERSION as CONDUCTOR_RPC_VERSION
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.db import allocations, instances
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance
from shared.objects.states import PowerState
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from shared.runtime import Lifecycle
from tests.functional.services.api.conftest import ADMIN, MEMBER, add_compute
from tests.functional.services.conductor.conftest import wait_for_conductor
from tests.functional.services.conductor.stand_in import eventually
from tests.unit.services.compute.standin import make_spec

pytestmark = pytest.mark.functional

FLAVOR = FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1)


@pytest.fixture
def reclaim() -> float:
    """``KEEL_RECLAIM_INSTANCE_INTERVAL`` for the test: long enough that the running
    conductor's own sweep never reclaims what a test soft-deletes (tests backdate)."""
    return 3600.0


@pytest.fixture
def settings(settings: Settings, reclaim: float) -> Settings:
    return settings.model_copy(update={"reclaim_instance_interval": reclaim})


@pytest.fixture
async def control(
    settings: Settings, transport: AmqpTransport, queues: list[str]
) -> AsyncIterator[None]:
    """keel-conductor running on the test's exchange."""
    lifecycle = Lifecycle()
    queues.append("conductor")
    run = asyncio.create_task(serve_conductor(settings, lifecycle))
    try:
        await wait_for_conductor(transport)
        yield
    finally:
        lifecycle.stopping.set()
        await run


@dataclass
class Host:
    service_id: int
    node_id: int
    node_host: str
    node_name: str
    driver: FakeDriver


@pytest.fixture
async def host(
    db_pool: asyncpg.Pool, transport: AmqpTransport, queues: list[str], control: None
) -> AsyncIterator[Host]:
    """A live compute host whose agent runs the fake driver."""
    service, node = await add_compute(db_pool, "host-a")
    driver = FakeDriver("host-a")
    manager = ComputeManager(driver, ConductorAPI(transport), node_uuid=node.uuid)
    topic = topic_for(service.uuid)
    server = RPCServer(transport, topic, manager, version=COMPUTE_RPC_VERSION)
    queues.append(topic)
    await server.start()
    yield Host(service.id, node.id, node.host, node.hypervisor_hostname, driver)
    await server.stop(1)


async def running_server(pool: asyncpg.Pool, host: Host) -> str:
    """An ACTIVE server of the member's project on ``host``, its guest running, claimed."""
    instance_uuid = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await instances.create(
            conn,
            instance_uuid=instance_uuid,
            project_id="team",
            user_id="alice",
            display_name="kept",
            flavor=FLAVOR,
            image_ref="cirros",
            availability_zone=None,
        )
        await instances.set_scheduled(
            conn,
            instance_uuid,
            host=host.node_host,
            node=host.node_name,
            compute_id=host.node_id,
        )
        assert await allocations.claim(conn, host.node_id, instance_uuid, FLAVOR)
        await instances.set_active(conn, instance_uuid)
    await host.driver.spawn(make_spec().model_copy(update={"uuid": instance_uuid}))
    return str(instance_uuid)


async def row(pool: asyncpg.Pool, server_id: str) -> Instance:
    async with pool.acquire() as conn:
        found = await instances.find(conn, UUID(server_id))
    assert found is not None
    return found


async def until_state(pool: asyncpg.Pool, server_id: str, vm_state: str) -> Instance:
    async def reached() -> Instance | None:
        found = await row(pool, server_id)
        return found if found.vm_state == vm_state and found.task_state is None else None

    return await eventually(reached)


async def claims(pool: asyncpg.Pool, server_id: str) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM allocations WHERE instance_uuid = $1", UUID(server_id)
        )
    return count


async def act(
    client: httpx.AsyncClient, server_id: str, action: str, headers: dict[str, str] = MEMBER
) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=headers, json={action: None}
    )


async def soft_deleted(client: httpx.AsyncClient, pool: asyncpg.Pool, host: Host) -> str:
    server_id = await running_server(pool, host)
    deleted = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert deleted.status_code == 204, deleted.text
    await until_state(pool, server_id, "soft-delete")
    return server_id


async def listed(
    client: httpx.AsyncClient, headers: dict[str, str], params: dict[str, str]
) -> list[str]:
    answer = await client.get("/v2.1/servers", headers=headers, params=params)
    assert answer.status_code == 200, answer.text
    return [server["id"] for server in answer.json()["servers"]]


async def actions(client: httpx.AsyncClient, server_id: str) -> list[dict[str, Any]]:
    listed = await client.get(f"/v2.1/servers/{server_id}/os-instance-actions", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    found: list[dict[str, Any]] = listed.json()["instanceActions"]
    return found


async def test_delete_keeps_the_server_off_with_its_claims_and_restore_runs_it_again(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    server_id = await running_server(db_pool, host)
    guest = UUID(server_id)

    deleted = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)

    assert deleted.status_code == 204, deleted.text
    kept = await until_state(db_pool, server_id, "soft-delete")
    assert kept.power_state == PowerState.SHUTDOWN
    assert kept.soft_deleted_at is not None
    assert await host.driver.guest_power(guest) == PowerState.SHUTDOWN
    assert await claims(db_pool, server_id) == 1
    shown = await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert shown.json()["server"]["status"] == "SOFT_DELETED"
    assert await listed(client, MEMBER, {}) == []
    assert await listed(client, MEMBER, {"status": "SOFT_DELETED"}) == []
    every = {"all_tenants": "1"}
    assert await listed(client, ADMIN, {**every, "deleted": "true"}) == [server_id]
    assert await listed(client, ADMIN, {**every, "soft_deleted": "true"}) == [server_id]
    assert await listed(client, ADMIN, {**every, "deleted": "true", "soft_deleted": "0"}) == []

    quota = await client.get("/v2.1/os-quota-sets/team/detail", headers=MEMBER)
    assert quota.json()["quota_set"]["instances"]["in_use"] == 1  # it still counts

    # A DELETE again changes nothing, not even the reclaim's clock.
    again = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert again.status_code == 204
    assert (await row(db_pool, server_id)).soft_deleted_at == kept.soft_deleted_at

    restored = await act(client, server_id, "restore")

    assert restored.status_code == 202, restored.text
    back = await until_state(db_pool, server_id, "active")
    assert back.power_state == PowerState.RUNNING
    assert back.soft_deleted_at is None
    assert await host.driver.guest_power(guest) == PowerState.RUNNING
    assert await claims(db_pool, server_id) == 1
    recorded = await actions(client, server_id)
    assert [(a["action"], a["message"]) for a in recorded[:2]] == [
        ("restore", None),
        ("delete", None),
    ]


async def test_force_delete_deletes_a_soft_deleted_server_and_releases_its_claims(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    server_id = await soft_deleted(client, db_pool, host)

    forced = await act(client, server_id, "forceDelete")

    assert forced.status_code == 202, forced.text
    gone = await until_state(db_pool, server_id, "deleted")
    assert gone.deleted_at is not None
    assert await claims(db_pool, server_id) == 0
    assert UUID(server_id) not in await host.driver.list_instances()
    missing = await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert missing.status_code == 404


async def test_restore_twice_at_once_restores_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    server_id = await soft_deleted(client, db_pool, host)

    answers = await asyncio.gather(*(act(client, server_id, "restore") for _ in "ab"))

    assert sorted(a.status_code for a in answers) == [202, 409]
    await until_state(db_pool, server_id, "active")
    assert await host.driver.guest_power(UUID(server_id)) == PowerState.RUNNING
    restores = [a for a in await actions(client, server_id) if a["action"] == "restore"]
    assert len(restores) == 1


async def test_force_delete_twice_at_once_deletes_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    server_id = await soft_deleted(client, db_pool, host)

    answers = await asyncio.gather(*(act(client, server_id, "forceDelete") for _ in "ab"))

    assert {a.status_code for a in answers} <= {202, 404}
    assert 202 in [a.status_code for a in answers]
    await until_state(db_pool, server_id, "deleted")
    assert await claims(db_pool, server_id) == 0
    assert UUID(server_id) not in await host.driver.list_instances()


async def test_wrong_states_and_locks_are_409(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    active = await running_server(db_pool, host)
    refused = await act(client, active, "restore")
    assert refused.status_code == 409
    assert (
        f"Cannot 'restore' instance {active} while it is in vm_state active"
        in (refused.json()["conflictingRequest"]["message"])
    )

    kept = await soft_deleted(client, db_pool, host)
    for action in ("os-start", "os-stop", "pause", "suspend", "migrate"):
        answer = await act(client, kept, action, ADMIN)
        assert answer.status_code == 409, (action, answer.text)
    reboot = await client.post(
        f"/v2.1/servers/{kept}/action", headers=MEMBER, json={"reboot": {"type": "HARD"}}
    )
    assert reboot.status_code == 409

    locked = await act(client, kept, "lock", ADMIN)
    assert locked.status_code == 202
    for action in ("restore", "forceDelete"):
        answer = await act(client, kept, action)
        assert answer.status_code == 409, action
        assert "is locked" in answer.json()["conflictingRequest"]["message"]
    assert (await row(db_pool, kept)).vm_state == "soft-delete"
    assert (await act(client, kept, "restore", ADMIN)).status_code == 202
    await until_state(db_pool, kept, "active")


async def test_with_its_host_down_restore_is_refused_and_force_delete_deletes_here(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    server_id = await soft_deleted(client, db_pool, host)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET forced_down = true WHERE id = $1", host.service_id)

    refused = await act(client, server_id, "restore")
    assert refused.status_code == 409
    assert "is down" in refused.json()["conflictingRequest"]["message"]
    assert (await row(db_pool, server_id)).vm_state == "soft-delete"

    forced = await act(client, server_id, "forceDelete")
    assert forced.status_code == 202
    assert (await row(db_pool, server_id)).deleted_at is not None
    assert await claims(db_pool, server_id) == 0


async def backdate(pool: asyncpg.Pool, server_id: str, seconds: float) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET soft_deleted_at = now() - make_interval(secs => $2)
                WHERE uuid = $1""",
            UUID(server_id),
            seconds,
        )


async def test_the_reclaim_deletes_only_expired_soft_deletes_once_when_run_twice_at_once(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    host: Host,
    transport: AmqpTransport,
    settings: Settings,
) -> None:
    expired = await soft_deleted(client, db_pool, host)
    fresh = await soft_deleted(client, db_pool, host)
    # Older than this sweep's interval, younger than the running conductor's.
    await backdate(db_pool, expired, 600)
    sweep = SoftDeleteReclaim(
        db_pool,
        ComputeAPI(transport),
        interval=300,
        down_time=settings.service_down_time,
    )

    taken = await asyncio.gather(sweep.sweep(), sweep.sweep())

    assert sorted(taken) == [0, 1]
    await until_state(db_pool, expired, "deleted")
    assert await claims(db_pool, expired) == 0
    assert UUID(expired) not in await host.driver.list_instances()
    assert (await row(db_pool, fresh)).vm_state == "soft-delete"
    assert await claims(db_pool, fresh) == 1
    assert await sweep.sweep() == 0
    async with db_pool.acquire() as conn:
        reclaims = await conn.fetch(
            "SELECT instance_uuid, result FROM instance_actions WHERE user_id = $1",
            RECLAIM_USER,
        )
    assert [(str(r["instance_uuid"]), r["result"]) for r in reclaims] == [(expired, "Success")]


async def test_the_reclaim_deletes_here_when_the_host_is_down(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    host: Host,
    transport: AmqpTransport,
) -> None:
    server_id = await soft_deleted(client, db_pool, host)
    await backdate(db_pool, server_id, 600)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET forced_down = true WHERE id = $1", host.service_id)
    sweep = SoftDeleteReclaim(db_pool, ComputeAPI(transport), interval=300, down_time=60)

    assert await sweep.sweep() == 1

    gone = await row(db_pool, server_id)
    assert gone.deleted_at is not None
    assert await claims(db_pool, server_id) == 0


@pytest.mark.parametrize("reclaim", [0.0])
async def test_without_an_interval_delete_deletes_at_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, host: Host
) -> None:
    server_id = await running_server(db_pool, host)

    deleted = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)

    assert deleted.status_code == 204
    gone = await until_state(db_pool, server_id, "deleted")
    assert isinstance(gone.deleted_at, datetime)
    assert await claims(db_pool, server_id) == 0
    assert UUID(server_id) not in await host.driver.list_instances()
    assert (await act(client, server_id, "restore")).status_code == 404
    nowhere = str(uuid.uuid4())
    for action in ("restore", "forceDelete"):
        assert (await act(client, nowhere, action)).status_code == 404


@pytest.mark.parametrize(
    ("compute_cap", "conductor_cap", "named"),
    [("1.11", None, "compute RPC 1.13"), (None, "1.13", "conductor RPC version is capped")],
)
async def test_older_agents_or_conductors_refuse_soft_delete_and_restore_with_a_409(
    *,
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    client: httpx.AsyncClient,
    host: Host,
    compute_cap: str | None,
    conductor_cap: str | None,
    named: str,
) -> None:
    """While the caps are below what soft delete needs, nothing changes: the DELETE that
    would soft-delete and the restore are 409s naming why; forceDelete still deletes."""
    kept = await soft_deleted(client, db_pool, host)
    running = await running_server(db_pool, host)
    app = create_app(
        settings,
        db_pool,
        ConductorAPI(transport, version_cap=conductor_cap or CONDUCTOR_RPC_VERSION),
        ComputeAPI(transport, version_cap=compute_cap or COMPUTE_RPC_VERSION),
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as old:
        deleted = await old.delete(f"/v2.1/servers/{running}", headers=MEMBER)
        restored = await act(old, kept, "restore")
        forced = await act(old, kept, "forceDelete")

    for refused in (deleted, restored):
        assert refused.status_code == 409, refused.text
        assert named in refused.json()["conflictingRequest"]["message"]
    assert ((await row(db_pool, running)).vm_state, (await row(db_pool, running)).task_state) == (
        "active",
        None,
    )
    assert forced.status_code == 202
    await until_state(db_pool, kept, "deleted")
