"""Servers through the API: create, read, list, delete, against PostgreSQL and RabbitMQ."""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import allocations, instances
from shared.objects.flavor import FlavorSnapshot
from tests.functional.services.api.conftest import (
    ADMIN,
    IMAGE_ID,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    StandInAgents,
    add_compute,
    add_image,
    at,
)

pytestmark = pytest.mark.functional

FLAVOR = FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1)


def server_body(name: str = "web-1", **extra: object) -> dict[str, object]:
    """What ``openstack server create`` sends."""
    return {
        "server": {
            "name": name,
            "imageRef": str(IMAGE_ID),
            "flavorRef": "1",
            "min_count": 1,
            "max_count": 1,
            "networks": "auto",
            "block_device_mapping_v2": [
                {
                    "boot_index": 0,
                    "uuid": str(IMAGE_ID),
                    "source_type": "image",
                    "destination_type": "local",
                }
            ],
            **extra,
        }
    }


async def create(
    client: httpx.AsyncClient, name: str = "web-1", headers: dict[str, str] = MEMBER
) -> str:
    response = await client.post(
        "/v2.1/servers", headers=at("2.73", headers), json=server_body(name)
    )
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    return server_id


async def test_create_is_accepted_readable_at_once_and_cast_to_the_conductor(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    response = await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=server_body())
    assert response.status_code == 202
    created = response.json()["server"]
    assert created["links"][0]["rel"] == "self"
    assert response.headers["Location"].endswith(f"/v2.1/servers/{created['id']}")

    shown = await client.get(f"/v2.1/servers/{created['id']}", headers=at("2.73", MEMBER))
    assert shown.status_code == 200
    server = shown.json()["server"]
    assert server["status"] == "BUILD"
    assert server["OS-EXT-STS:task_state"] == "scheduling"
    assert server["image"]["id"] == str(IMAGE_ID)
    assert server["flavor"]["original_name"] == "m1.tiny"
    assert (server["tenant_id"], server["user_id"]) == ("team", "alice")

    ctx, instance_uuid = await conductor.next_build()
    assert str(instance_uuid) == created["id"]
    assert ctx.request_id == response.headers["x-openstack-request-id"]
    assert ctx.project_id == "team"


async def test_create_records_the_request_spec_and_action(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    async with db_pool.acquire() as conn:
        spec = await conn.fetchval(
            "SELECT spec FROM request_specs WHERE instance_uuid = $1::uuid", server_id
        )
        action = await conn.fetchval(
            "SELECT action FROM instance_actions WHERE instance_uuid = $1::uuid", server_id
        )
    assert spec["flavor"]["flavorid"] == "1"
    assert spec["image_ref"] == str(IMAGE_ID)
    assert action == "create"


async def test_create_refuses_what_it_cannot_do(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    cases = {
        "unknown flavor": {"flavorRef": "99"},
        "unknown image": {"imageRef": "00000000-0000-0000-0000-000000000000"},
        "fewer than the minimum": {"min_count": 3, "max_count": 2},
        "unknown zone": {"availability_zone": "nowhere"},
    }
    for what, change in cases.items():
        body = server_body()
        body["server"] = {**body["server"], **change}  # type: ignore[dict-item]
        response = await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=body)
        assert response.status_code == 400, what
        assert response.json()["badRequest"]["message"], what
    listed = await client.get("/v2.1/servers", headers=MEMBER)
    assert listed.json()["servers"] == []


async def test_create_in_a_known_zone(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    await add_compute(db_pool, "compute-1", zone="az1")
    body = server_body(availability_zone="az1")
    response = await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=body)
    assert response.status_code == 202
    server = (
        await client.get(f"/v2.1/servers/{response.json()['server']['id']}", headers=MEMBER)
    ).json()
    assert server["server"]["OS-EXT-AZ:availability_zone"] == "az1"


async def test_create_without_a_conductor_is_503_and_leaves_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool)
    response = await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=server_body())
    assert response.status_code == 503
    assert "keel-conductor" in response.json()["serviceUnavailable"]["message"]
    listed = await client.get("/v2.1/servers", headers=MEMBER)
    assert listed.json()["servers"] == []


async def test_list_detail_and_name_filter(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    first = await create(client, "web-1")
    second = await create(client, "db-1")

    listed = await client.get("/v2.1/servers", headers=MEMBER, params={"deleted": "False"})
    assert [s["id"] for s in listed.json()["servers"]] == [second, first]
    assert set(listed.json()["servers"][0]) == {"id", "name", "links"}

    detail = await client.get("/v2.1/servers/detail", headers=at("2.73", MEMBER))
    assert {s["status"] for s in detail.json()["servers"]} == {"BUILD"}

    named = await client.get("/v2.1/servers/detail", headers=MEMBER, params={"name": "^web"})
    assert [s["name"] for s in named.json()["servers"]] == ["web-1"]

    building = await client.get("/v2.1/servers", headers=MEMBER, params={"status": "BUILD"})
    assert len(building.json()["servers"]) == 2
    active = await client.get("/v2.1/servers", headers=MEMBER, params={"status": "ACTIVE"})
    assert active.json()["servers"] == []


async def test_limit_and_marker_page_through_servers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    made = [await create(client, f"vm-{n}") for n in range(3)]
    page = await client.get("/v2.1/servers", headers=MEMBER, params={"limit": 2})
    assert [s["id"] for s in page.json()["servers"]] == made[:0:-1]
    assert page.json()["servers_links"][0]["rel"] == "next"
    rest = await client.get("/v2.1/servers", headers=MEMBER, params={"limit": 2, "marker": made[1]})
    assert [s["id"] for s in rest.json()["servers"]] == [made[0]]
    assert "servers_links" not in rest.json()
    for path in ("/v2.1/servers", "/v2.1/servers/detail"):
        none = await client.get(path, headers=MEMBER, params={"limit": 0})
        assert none.status_code == 200, none.text
        assert none.json() == {"servers": []}


async def test_projects_see_only_their_servers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    mine = await create(client, "mine", MEMBER)
    theirs = await create(client, "theirs", OTHER_MEMBER)

    listed = await client.get("/v2.1/servers", headers=MEMBER)
    assert [s["id"] for s in listed.json()["servers"]] == [mine]
    hidden = await client.get(f"/v2.1/servers/{theirs}", headers=MEMBER)
    assert hidden.status_code == 404
    refused = await client.get("/v2.1/servers", headers=MEMBER, params={"all_tenants": "True"})
    assert refused.status_code == 403

    everything = await client.get("/v2.1/servers", headers=ADMIN, params={"all_tenants": "1"})
    assert {s["id"] for s in everything.json()["servers"]} == {mine, theirs}
    one_project = await client.get(
        "/v2.1/servers", headers=ADMIN, params={"all_tenants": "1", "project_id": "elsewhere"}
    )
    assert [s["id"] for s in one_project.json()["servers"]] == [theirs]
    own = await client.get("/v2.1/servers", headers=ADMIN)
    assert own.json()["servers"] == []


async def test_admins_see_placement_and_members_do_not(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    _, node = await add_compute(db_pool, "compute-1")
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host=node.host, node=node.hypervisor_hostname, compute_id=node.id
        )

    admin = (await client.get(f"/v2.1/servers/{server_id}", headers=at("2.73"))).json()["server"]
    member = (await client.get(f"/v2.1/servers/{server_id}", headers=at("2.73", MEMBER))).json()
    assert admin["OS-EXT-SRV-ATTR:host"] == "compute-1"
    assert admin["OS-EXT-SRV-ATTR:hypervisor_hostname"] == "compute-1"
    assert admin["host_status"] == "UP"
    assert "OS-EXT-SRV-ATTR:host" not in member["server"]
    on_host = await client.get(
        "/v2.1/servers", headers=ADMIN, params={"all_tenants": "1", "host": "compute-1"}
    )
    assert [s["id"] for s in on_host.json()["servers"]] == [server_id]


async def test_error_servers_show_their_fault(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    async with db_pool.acquire() as conn:
        await instances.set_build_failed(
            conn, UUID(server_id), message="No valid host was found.", details="filters: RAM"
        )
    server = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    assert server["status"] == "ERROR"
    assert server["fault"]["message"] == "No valid host was found."
    assert "details" not in server["fault"]
    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=ADMIN)).json()["server"]
    assert shown["fault"]["details"] == "filters: RAM"


async def test_unknown_server_is_item_not_found(client: httpx.AsyncClient) -> None:
    for server_id in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        response = await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)
        assert response.status_code == 404
        assert response.json()["itemNotFound"]["code"] == 404


async def test_delete_of_an_unscheduled_server_is_local(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    response = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert response.status_code == 204
    assert response.content == b""
    gone = await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert gone.status_code == 404
    again = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert again.status_code == 404
    async with db_pool.acquire() as conn:
        actions = await conn.fetch(
            "SELECT action, finish_time FROM instance_actions WHERE instance_uuid = $1::uuid",
            server_id,
        )
    assert {(a["action"], a["finish_time"] is not None) for a in actions} >= {("delete", True)}


async def test_delete_on_a_live_host_asks_its_agent(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder, agents: StandInAgents
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    service, node = await add_compute(db_pool, "compute-1")
    await agents.serve(service.uuid)
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host=node.host, node=node.hypervisor_hostname, compute_id=node.id
        )
        await allocations.claim(conn, node.id, UUID(server_id), FLAVOR)

    response = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert response.status_code == 204
    assert str(await agents.recorder.next_termination()) == server_id
    server = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    assert server["OS-EXT-STS:task_state"] == "deleting"
    async with db_pool.acquire() as conn:
        assert await allocations.for_instance(conn, UUID(server_id)) != []


async def test_delete_on_a_down_host_is_local_and_releases_the_claim(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    _, node = await add_compute(db_pool, "compute-1", up=False)
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host=node.host, node=node.hypervisor_hostname, compute_id=node.id
        )
        await allocations.claim(conn, node.id, UUID(server_id), FLAVOR)

    response = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert response.status_code == 204
    assert (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).status_code == 404
    async with db_pool.acquire() as conn:
        assert await allocations.for_instance(conn, UUID(server_id)) == []
        used = await conn.fetchval("SELECT vcpus_used FROM compute_nodes WHERE id = $1", node.id)
    assert used == 0


async def test_delete_when_the_agent_has_no_queue_is_local(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    _, node = await add_compute(db_pool, "compute-1")
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host=node.host, node=node.hypervisor_hostname, compute_id=node.id
        )
    response = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert response.status_code == 204
    assert (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).status_code == 404


async def test_bad_requests_are_400_with_a_fault_body(client: httpx.AsyncClient) -> None:
    malformed = await client.post(
        "/v2.1/servers",
        headers={**MEMBER, "Content-Type": "application/json"},
        content=b'{"server": {"name": ',
    )
    assert malformed.status_code == 400
    assert "Malformed request body" in malformed.json()["badRequest"]["message"]
    wrong_type = await client.post(
        "/v2.1/servers", headers=MEMBER, json={"server": {"name": ["x"], "flavorRef": "1"}}
    )
    assert wrong_type.status_code == 400
    assert "server.name" in wrong_type.json()["badRequest"]["message"]
    bad_regex = await client.get("/v2.1/servers", headers=MEMBER, params={"name": "("})
    assert bad_regex.status_code == 400
    bad_marker = await client.get("/v2.1/servers", headers=MEMBER, params={"marker": "nope"})
    assert bad_marker.status_code == 400


async def test_delete_of_a_row_without_compute_id_reaches_its_agent_by_host_name(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    agents: StandInAgents,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    service, node = await add_compute(db_pool, "compute-1")
    await agents.serve(service.uuid)
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host=node.host, node=node.hypervisor_hostname, compute_id=node.id
        )
        # As a release without compute_id wrote it.
        await conn.execute("UPDATE instances SET compute_id = NULL WHERE uuid = $1", server_id)

    with caplog.at_level(logging.WARNING, logger="shared.db.placement"):
        response = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)

    assert response.status_code == 204
    assert str(await agents.recorder.next_termination()) == server_id
    assert any("online-data-migrations" in r.getMessage() for r in caplog.records)


async def test_delete_follows_compute_id_even_when_the_names_are_stale(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder, agents: StandInAgents
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    service, node = await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "compute-2")
    await agents.serve(service.uuid)
    async with db_pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host="compute-2", node="compute-2", compute_id=node.id
        )

    response = await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)

    assert response.status_code == 204
    assert str(await agents.recorder.next_termination()) == server_id
