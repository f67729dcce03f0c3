"""``keel-manage service rename OLD NEW``: only while OLD is stopped, all in one go."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from shared.db import compute_nodes, instances, services
from shared.db.pool import Connection
from shared.objects.compute_node import NodeResources
from shared.objects.flavor import FlavorSnapshot
from tests.functional.services.manage.test_manage import manage

pytestmark = pytest.mark.functional

FLAVOR = FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1)


async def add_host(conn: Connection, host: str, *, up: bool) -> tuple[uuid.UUID, int]:
    service = await services.get_or_create(
        conn, host=host, binary="keel-compute", topic="compute", version=3, down_time=60
    )
    if up:
        await services.heartbeat(conn, service.uuid, 3)
    node = await compute_nodes.upsert(
        conn,
        node_uuid=uuid.uuid4(),
        service_id=service.id,
        host=host,
        resources=NodeResources(
            hypervisor_hostname=host,
            vcpus=4,
            memory_mb=4096,
            local_gb=40,
            cpu_allocation_ratio=1.0,
            ram_allocation_ratio=1.0,
            disk_allocation_ratio=1.0,
        ),
    )
    return service.uuid, node.id


async def add_server(conn: Connection, host: str, node_id: int | None) -> uuid.UUID:
    instance_uuid = uuid.uuid4()
    await instances.create(
        conn,
        instance_uuid=instance_uuid,
        project_id="p",
        user_id="u",
        display_name="vm",
        flavor=FLAVOR,
        image_ref="",
        availability_zone=None,
    )
    await conn.execute(
        "UPDATE instances SET host = $2, node = $2, compute_id = $3 WHERE uuid = $1",
        instance_uuid,
        host,
        node_id,
    )
    return instance_uuid


async def test_rename_of_a_stopped_host_moves_service_nodes_and_servers(
    db_pool: asyncpg.Pool, database_url: str
) -> None:
    async with db_pool.acquire() as conn:
        service_uuid, node_id = await add_host(conn, "host-a", up=False)
        linked = await add_server(conn, "host-a", node_id)
        legacy = await add_server(conn, "host-a", None)  # written by release 1: no id yet
        other = await add_server(conn, "host-c", None)

    result = manage(database_url, "service", "rename", "host-a", "host-b")

    assert result.returncode == 0, result.stderr
    assert f"service {service_uuid}, 1 node(s), 2 server row(s)" in result.stdout
    async with db_pool.acquire() as conn:
        service = await services.get(conn, service_uuid, 60)
        node = await compute_nodes.get_by_id(conn, node_id)
        moved = [await instances.get(conn, i) for i in (linked, legacy, other)]
    assert service.host == "host-b"
    assert node.host == "host-b"
    assert [(i.host, i.compute_id) for i in moved] == [
        ("host-b", node_id),
        ("host-b", None),
        ("host-c", None),
    ]


async def test_rename_is_refused_while_up_when_new_exists_or_old_is_missing(
    db_pool: asyncpg.Pool, database_url: str
) -> None:
    async with db_pool.acquire() as conn:
        await add_host(conn, "running", up=True)
        await add_host(conn, "stopped", up=False)
        before = await conn.fetch("SELECT to_jsonb(s)::text FROM services s ORDER BY id")

    up = manage(database_url, "service", "rename", "running", "renamed")
    taken = manage(database_url, "service", "rename", "stopped", "running")
    missing = manage(database_url, "service", "rename", "nowhere", "renamed")
    same = manage(database_url, "service", "rename", "stopped", "stopped")

    assert (up.returncode, taken.returncode, missing.returncode) == (1, 1, 1)
    assert "is up, its last heartbeat was" in up.stderr
    assert "Stop it first" in up.stderr
    assert "host 'running' already has a compute service" in taken.stderr
    assert "there is no compute service on host 'nowhere'" in missing.stderr
    assert same.returncode == 2
    async with db_pool.acquire() as conn:
        after = await conn.fetch("SELECT to_jsonb(s)::text FROM services s ORDER BY id")
    assert after == before
