"""Availability zones, hypervisor statistics and the pre-2.53 hypervisor routes, images'
os_hidden, and compute paths with a trailing slash."""

from __future__ import annotations

from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import images, instances, services
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def add_conductor(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        service = await services.get_or_create(
            conn,
            host="control",
            binary="keel-conductor",
            topic="conductor",
            version=1,
            down_time=60,
        )
        await services.heartbeat(conn, service.uuid, 1)


async def test_zones_for_members_and_the_detail_for_admins(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_conductor(db_pool)
    await add_compute(db_pool, "compute-1", zone="az1")
    await add_compute(db_pool, "compute-2", zone="nova", up=False)
    retired, _ = await add_compute(db_pool, "compute-3", zone="az9")
    async with db_pool.acquire() as conn:
        await services.update_status(conn, retired.uuid, 60, disabled=True)

    listed = await client.get("/v2.1/os-availability-zone", headers=MEMBER)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {
        "availabilityZoneInfo": [
            {"zoneName": "az1", "zoneState": {"available": True}, "hosts": None},
            {"zoneName": "nova", "zoneState": {"available": True}, "hosts": None},
            {"zoneName": "az9", "zoneState": {"available": False}, "hosts": None},
        ]
    }
    assert (
        await client.get("/v2.1/os-availability-zone/detail", headers=MEMBER)
    ).status_code == 403
    detail = await client.get("/v2.1/os-availability-zone/detail", headers=ADMIN)
    zones = {z["zoneName"]: z for z in detail.json()["availabilityZoneInfo"]}
    assert set(zones) == {"az1", "nova", "internal", "az9"}
    compute1 = zones["az1"]["hosts"]["compute-1"]["keel-compute"]
    assert (compute1["available"], compute1["active"]) == (True, True)
    assert compute1["updated_at"] is not None
    assert zones["nova"]["hosts"]["compute-2"]["keel-compute"]["available"] is False
    assert set(zones["internal"]["hosts"]["control"]) == {"keel-conductor"}
    assert zones["az9"] == {"zoneName": "az9", "zoneState": {"available": False}, "hosts": None}


async def test_hypervisor_statistics_sum_enabled_nodes(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "compute-1")
    off, _ = await add_compute(db_pool, "compute-2")
    async with db_pool.acquire() as conn:
        await services.update_status(conn, off.uuid, 60, disabled=True)
    for version in ("2.1", "2.73"):
        response = await client.get("/v2.1/os-hypervisors/statistics", headers=at(version))
        assert response.status_code == 200, response.text
        stats = response.json()["hypervisor_statistics"]
        assert (stats["count"], stats["vcpus"], stats["memory_mb"]) == (1, 8, 16384)
        assert stats["free_ram_mb"] == 16384
    assert (await client.get("/v2.1/os-hypervisors/statistics", headers=MEMBER)).status_code == 403


async def test_search_and_servers_below_2_53_and_with_servers_from_it(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "storage-1")
    server_id = await create(client)
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host=node.host, node=node.hypervisor_hostname, compute_id=node.id
        )

    found = await client.get("/v2.1/os-hypervisors/comp/search", headers=at("2.52"))
    assert found.json() == {
        "hypervisors": [
            {"id": node.id, "hypervisor_hostname": "compute-1", "state": "up", "status": "enabled"}
        ]
    }
    with_servers = await client.get("/v2.1/os-hypervisors/compute-1/servers", headers=ADMIN)
    [hypervisor] = with_servers.json()["hypervisors"]
    assert hypervisor["hypervisor_hostname"] == "compute-1"
    [server] = hypervisor["servers"]
    assert server["uuid"] == server_id
    assert server["name"].startswith("instance-")
    none_here = await client.get("/v2.1/os-hypervisors/storage/servers", headers=ADMIN)
    assert "servers" not in none_here.json()["hypervisors"][0]
    missing = await client.get("/v2.1/os-hypervisors/nothing/search", headers=ADMIN)
    assert missing.status_code == 404
    assert (
        missing.json()["itemNotFound"]["message"]
        == "No hypervisor matching 'nothing' could be found."
    )
    assert (
        await client.get("/v2.1/os-hypervisors/comp/search", headers=at("2.53"))
    ).status_code == 404

    listed = await client.get(
        "/v2.1/os-hypervisors",
        headers=at("2.53"),
        params={"hypervisor_hostname_pattern": "compute", "with_servers": "true"},
    )
    [hypervisor] = listed.json()["hypervisors"]
    assert [s["uuid"] for s in hypervisor["servers"]] == [server_id]
    bad = await client.get("/v2.1/os-hypervisors", headers=at("2.53"), params={"with_servers": "x"})
    assert bad.status_code == 400


async def test_a_trailing_slash_is_answered_not_redirected(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    response = await client.get("/v2.1/servers/", headers=MEMBER)
    assert response.status_code == 200
    assert response.json() == {"servers": []}
    assert (await client.get("/v2.1/flavors/detail/", headers=MEMBER)).status_code == 200
    root = await client.get("/v2.1/")
    assert root.json()["version"]["id"] == "v2.1"


async def test_hidden_images_are_listed_only_when_asked_for(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    prefix = "/image/v2"
    await add_image(db_pool, "cirros")
    async with db_pool.acquire() as conn:
        await images.create(
            conn,
            image_id=UUID("44444444-2222-3333-4444-555555555555"),
            name="hidden",
            properties={"os_hidden": True},
        )

    async def listed(params: dict[str, str]) -> list[str] | int:
        response = await client.get(f"{prefix}/images", headers=MEMBER, params=params)
        if response.status_code != 200:
            return response.status_code
        return [image["name"] for image in response.json()["images"]]

    assert await listed({}) == ["cirros"]
    assert await listed({"os_hidden": "false"}) == ["cirros"]
    assert await listed({"os_hidden": "true"}) == ["hidden"]
    assert await listed({"os_hidden": "maybe"}) == 400


async def test_an_empty_project_id_for_usage_is_404_as_in_nova(
    client: httpx.AsyncClient,
) -> None:
    for path in ("/v2.1/os-simple-tenant-usage/", "/v2.1/os-simple-tenant-usage//"):
        empty = await client.get(path, headers=ADMIN)
        assert empty.status_code == 404, path
        assert empty.json()["itemNotFound"]["code"] == 404
        assert "x-openstack-request-id" in empty.headers
    since = {"start": "2024-01-01T00:00:00"}
    listed = await client.get("/v2.1/os-simple-tenant-usage", headers=ADMIN, params=since)
    assert listed.status_code == 200, listed.text
    shown = await client.get("/v2.1/os-simple-tenant-usage/team/", headers=ADMIN, params=since)
    assert shown.status_code == 200, shown.text
    assert (await client.get("/v2.1/servers/", headers=MEMBER)).status_code == 200
    # A member is still told nothing more than a 404 either.
    assert (await client.get("/v2.1/os-simple-tenant-usage/", headers=MEMBER)).status_code == 404
