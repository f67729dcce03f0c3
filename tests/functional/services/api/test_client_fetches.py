"""What stock clients fetch on their way: a server's security groups, the image schemas,
and a hypervisor's uptime when its agent is gone."""

from __future__ import annotations

import time

import asyncpg
import httpx
import jsonschema_rs
import pytest

from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    StandInAgents,
    add_compute,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def test_a_servers_security_groups_are_its_projects_default_group(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    first, second = await create(client, "web-1"), await create(client, "web-2")

    shown = await client.get(f"/v2.1/servers/{first}/os-security-groups", headers=MEMBER)
    assert shown.status_code == 200, shown.text
    [group] = shown.json()["security_groups"]
    assert group["name"] == "default"
    assert group["tenant_id"] == "team"
    assert group["rules"] == []
    again = await client.get(f"/v2.1/servers/{second}/os-security-groups", headers=MEMBER)
    assert again.json()["security_groups"][0]["id"] == group["id"]

    theirs = await client.get(f"/v2.1/servers/{first}/os-security-groups", headers=OTHER_MEMBER)
    assert theirs.status_code == 404
    unknown = await client.get("/v2.1/servers/nothing/os-security-groups", headers=MEMBER)
    assert unknown.status_code == 404


async def test_image_bodies_validate_against_the_image_schemas(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool)
    registered = await client.post(
        "/image/v2/images",
        headers=ADMIN,
        json={"name": "with-properties", "disk_format": "qcow2", "os_distro": "cirros"},
    )
    assert registered.status_code == 201, registered.text

    schema = (await client.get("/image/v2/schemas/image", headers=MEMBER)).json()
    assert schema["name"] == "image"
    listing_schema = (await client.get("/image/v2/schemas/images", headers=MEMBER)).json()
    listed = (await client.get("/image/v2/images", headers=ADMIN)).json()
    assert len(listed["images"]) == 2
    jsonschema_rs.validate(listing_schema, listed)
    for image in listed["images"]:
        jsonschema_rs.validate(schema, image)
        assert image["schema"] == "/v2/schemas/image"

    with pytest.raises(jsonschema_rs.ValidationError):
        jsonschema_rs.validate(schema, {**listed["images"][0], "os_distro": 7})
    refused = await client.get("/image/v2/schemas/image")
    assert refused.status_code == 401


async def test_uptime_of_a_host_whose_agent_is_gone_is_refused_at_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents
) -> None:
    """The service still counts as up (its last heartbeat is recent), but nothing consumes
    its queue any more: the answer is the 400 of a down host, not a call timeout."""
    service, node = await add_compute(db_pool, "compute-1")
    await agents.serve(service.uuid)
    await agents.stop()

    began = time.monotonic()
    answer = await client.get(f"/v2.1/os-hypervisors/{node.uuid}/uptime", headers=at("2.53"))
    assert answer.status_code == 400, answer.text
    assert "compute-1 is unavailable" in answer.json()["badRequest"]["message"]
    assert time.monotonic() - began < 5


async def test_the_networking_api_shows_the_same_default_group(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client, "web-1")
    [group] = (
        await client.get(f"/v2.1/servers/{server}/os-security-groups", headers=MEMBER)
    ).json()["security_groups"]

    listed = await client.get("/network/v2.0/security-groups?name=default", headers=MEMBER)
    [found] = listed.json()["security_groups"]
    assert (found["id"], found["project_id"], found["security_group_rules"]) == (
        group["id"],
        "team",
        [],
    )
    shown = await client.get(f"/network/v2.0/security-groups/{group['id']}", headers=MEMBER)
    assert shown.json()["security_group"]["name"] == "default"
    hidden = await client.get(f"/network/v2.0/security-groups/{group['id']}", headers=OTHER_MEMBER)
    assert hidden.status_code == 404
    assert hidden.json()["NeutronError"]["type"] == "SecurityGroupNotFound"
    by_admin = await client.get(f"/network/v2.0/security-groups/{group['id']}", headers=ADMIN)
    assert by_admin.status_code == 200
    theirs = await client.get("/network/v2.0/security-groups?project_id=team", headers=ADMIN)
    assert [g["id"] for g in theirs.json()["security_groups"]] == [group["id"]]


async def test_a_servers_password_is_empty_and_clearing_it_keeps_it_so(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client, "web-1")
    path = f"/v2.1/servers/{server}/os-server-password"
    assert (await client.get(path, headers=MEMBER)).json() == {"password": ""}
    assert (await client.delete(path, headers=MEMBER)).status_code == 204
    assert (await client.get(path, headers=MEMBER)).json() == {"password": ""}
    assert (await client.get(path, headers=OTHER_MEMBER)).status_code == 404
