"""Instance actions and migrations as the compute API shows them, on real PostgreSQL."""

from __future__ import annotations

import uuid
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, moves, services
from shared.objects.compute_node import ComputeNode, NodeResources
from shared.objects.migration import MigrationStatus, MigrationType
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def finish(pool: asyncpg.Pool, server_id: str, action: str, message: str | None) -> None:
    async with pool.acquire() as conn:
        await instance_actions.finish(conn, UUID(server_id), action, message)


async def test_actions_list_newest_first_and_show_one_with_its_event(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    await finish(db_pool, server_id, "create", None)
    async with db_pool.acquire() as conn:
        ctx = RequestContext(user_id="alice", project_id="team")
        await instance_actions.start(conn, ctx, UUID(server_id), "stop")
    await finish(db_pool, server_id, "stop", "the guest would not stop")
    base = f"/v2.1/servers/{server_id}/os-instance-actions"

    listed = await client.get(base, headers=at("2.58", MEMBER))
    assert listed.status_code == 200, listed.text
    actions = listed.json()["instanceActions"]
    assert [a["action"] for a in actions] == ["stop", "create"]
    assert actions[0]["message"] == "the guest would not stop"
    assert actions[0]["updated_at"] is not None

    request_id = actions[0]["request_id"]
    shown = await client.get(f"{base}/{request_id}", headers=at("2.62", ADMIN))
    [event] = shown.json()["instanceAction"]["events"]
    assert (event["event"], event["result"]) == ("compute_stop", "Error")
    assert "host" in event

    old = await client.get(f"{base}/{request_id}", headers=at("2.50", MEMBER))
    assert "events" not in old.json()["instanceAction"]
    assert (await client.get(base, headers=at("2.1", OTHER_MEMBER))).status_code == 404


async def test_actions_page_from_2_58(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    async with db_pool.acquire() as conn:
        for name in ("stop", "start", "reboot"):
            await instance_actions.start(conn, RequestContext(), UUID(server_id), name)
    base = f"/v2.1/servers/{server_id}/os-instance-actions"

    first = await client.get(f"{base}?limit=2", headers=at("2.58"))
    page = first.json()["instanceActions"]
    assert [a["action"] for a in page] == ["reboot", "start"]
    rest = await client.get(f"{base}?marker={page[-1]['request_id']}", headers=at("2.58"))
    assert [a["action"] for a in rest.json()["instanceActions"]] == ["stop", "create"]
    bad = await client.get(f"{base}?marker=req-nope", headers=at("2.58"))
    assert bad.status_code == 400
    unpaged = await client.get(f"{base}?limit=1", headers=at("2.57"))
    assert len(unpaged.json()["instanceActions"]) == 4


async def test_actions_of_a_deleted_server_from_2_21(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    assert (await client.delete(f"/v2.1/servers/{server_id}", headers=ADMIN)).status_code == 204
    base = f"/v2.1/servers/{server_id}/os-instance-actions"

    assert (await client.get(base, headers=at("2.20"))).status_code == 404
    shown = await client.get(base, headers=at("2.21"))
    assert [a["action"] for a in shown.json()["instanceActions"]] == ["delete", "create"]


async def _node(pool: asyncpg.Pool, host: str) -> ComputeNode:
    async with pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host=host, binary="keel-compute", topic="compute", version=3, down_time=60
        )
        return await compute_nodes.upsert(
            conn,
            node_uuid=uuid.uuid4(),
            service_id=service.id,
            host=host,
            resources=NodeResources(
                hypervisor_hostname=host,
                vcpus=4,
                memory_mb=4096,
                local_gb=40,
                cpu_allocation_ratio=1,
                ram_allocation_ratio=1,
                disk_allocation_ratio=1,
            ),
        )


async def test_migrations_are_listed_and_filtered_as_nova_does(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    a, b = await _node(db_pool, "host-a"), await _node(db_pool, "host-b")
    instance = uuid.uuid4()
    async with db_pool.acquire() as conn:
        evacuation = await moves.create(
            conn,
            RequestContext(user_id="root", project_id="ops"),
            instance_uuid=instance,
            migration_type=MigrationType.EVACUATION,
            status=MigrationStatus.ACCEPTED,
            source=a,
        )
        await moves.swap_status(
            conn,
            evacuation.uuid,
            expected=[MigrationStatus.ACCEPTED],
            new=MigrationStatus.DONE,
            dest=b,
        )
        await moves.create(
            conn,
            RequestContext(),
            instance_uuid=uuid.uuid4(),
            migration_type=MigrationType.MIGRATION,
            status=MigrationStatus.FINISHED,
            source=b,
        )

    listed = await client.get("/v2.1/os-migrations", headers=at("2.59"))
    assert listed.status_code == 200, listed.text
    assert [m["migration_type"] for m in listed.json()["migrations"]] == [
        "migration",
        "evacuation",
    ]
    [done] = (
        await client.get("/v2.1/os-migrations?migration_type=evacuation", headers=at("2.59"))
    ).json()["migrations"]
    assert (done["source_compute"], done["dest_compute"], done["status"]) == (
        "host-a",
        "host-b",
        "done",
    )
    assert done["uuid"] == str(evacuation.uuid)
    by_host = await client.get("/v2.1/os-migrations?host=host-a", headers=at("2.23"))
    assert [m["id"] for m in by_host.json()["migrations"]] == [done["id"]]
    assert "uuid" not in by_host.json()["migrations"][0]
    by_instance = await client.get(
        f"/v2.1/os-migrations?instance_uuid={instance}&status=done", headers=at("2.1")
    )
    [old] = by_instance.json()["migrations"]
    assert "migration_type" not in old
    paged = await client.get("/v2.1/os-migrations?limit=1", headers=at("2.59"))
    assert len(paged.json()["migrations"]) == 1
    assert "marker=" in paged.json()["migrations_links"][0]["href"]
    assert (await client.get("/v2.1/os-migrations", headers=MEMBER)).status_code == 403
