"""Security groups over real PostgreSQL: created, shown, renamed and deleted through the
Networking API; servers put in and taken out of them with Nova's actions, and each
action run twice at once changing the server once."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import create, server_body

pytestmark = pytest.mark.functional

BASE = "/network/v2.0"


async def new_group(
    client: httpx.AsyncClient, name: str, headers: dict[str, str] = MEMBER
) -> dict[str, Any]:
    made = await client.post(
        f"{BASE}/security-groups",
        headers=headers,
        json={"security_group": {"name": name, "description": f"{name} servers"}},
    )
    assert made.status_code == 201, made.text
    group: dict[str, Any] = made.json()["security_group"]
    return group


async def act(client: httpx.AsyncClient, server_id: str, action: str, value: Any) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={action: value}
    )


async def groups_of(client: httpx.AsyncClient, server_id: str) -> list[str] | None:
    server = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    listed = await client.get(f"/v2.1/servers/{server_id}/os-security-groups", headers=MEMBER)
    names = [g["name"] for g in listed.json()["security_groups"]]
    if "security_groups" not in server:
        assert names == []
        return None
    assert [g["name"] for g in server["security_groups"]] == names
    return names


async def test_a_project_creates_renames_and_deletes_its_groups(client: httpx.AsyncClient) -> None:
    group = await new_group(client, "web")
    assert (group["name"], group["description"], group["project_id"]) == (
        "web",
        "web servers",
        "team",
    )
    assert group["security_group_rules"] == []
    listed = (await client.get(f"{BASE}/security-groups", headers=MEMBER)).json()
    assert [g["name"] for g in listed["security_groups"]] == ["default", "web"]
    others = (await client.get(f"{BASE}/security-groups", headers=OTHER_MEMBER)).json()
    assert [g["name"] for g in others["security_groups"]] == ["default"]
    path = f"{BASE}/security-groups/{group['id']}"
    assert (await client.get(path, headers=OTHER_MEMBER)).status_code == 404
    renamed = await client.put(path, headers=MEMBER, json={"security_group": {"name": "www"}})
    assert renamed.status_code == 200, renamed.text
    assert (await client.get(path, headers=MEMBER)).json()["security_group"]["name"] == "www"

    rule = await client.post(
        f"{BASE}/security-group-rules",
        headers=MEMBER,
        json={"security_group_rule": {"security_group_id": group["id"], "direction": "ingress"}},
    )
    assert rule.status_code == 400
    assert "filters no traffic" in rule.json()["NeutronError"]["message"]
    rules = await client.get(f"{BASE}/security-group-rules", headers=MEMBER)
    assert rules.json() == {"security_group_rules": []}

    named_default = await client.post(
        f"{BASE}/security-groups", headers=MEMBER, json={"security_group": {"name": "default"}}
    )
    assert named_default.status_code == 409
    # Creates and updates run twice at once: two groups (as Neutron, names need not be
    # unique), and the same name twice.
    twins = await asyncio.gather(*(new_group(client, "twin") for _ in range(2)))
    assert twins[0]["id"] != twins[1]["id"]
    ambiguous = await client.get(f"{BASE}/security-groups", headers=MEMBER, params={"name": "twin"})
    assert len(ambiguous.json()["security_groups"]) == 2
    body = {"security_group": {"description": "again"}}
    updated = await asyncio.gather(*(client.put(path, headers=MEMBER, json=body) for _ in range(2)))
    assert [u.status_code for u in updated] == [200, 200]
    assert (await client.get(path, headers=MEMBER)).json()["security_group"]["description"] == (
        "again"
    )
    gone = await asyncio.gather(*(client.delete(path, headers=MEMBER) for _ in range(2)))
    assert sorted(g.status_code for g in gone) == [204, 404]


async def test_servers_join_and_leave_groups_as_nova_answers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    web = await new_group(client, "web")
    assert await groups_of(client, server_id) == ["default"]

    assert (await act(client, server_id, "addSecurityGroup", {"name": "web"})).status_code == 202
    assert await groups_of(client, server_id) == ["default", "web"]
    ports = await client.get(f"{BASE}/ports", headers=MEMBER, params={"device_id": server_id})
    [port] = ports.json()["ports"]
    assert port["security_groups"][1:] == [web["id"]]
    already = await act(client, server_id, "addSecurityGroup", {"name": "web"})
    assert already.status_code == 400
    assert "already associated" in already.json()["badRequest"]["message"]
    unknown = await act(client, server_id, "addSecurityGroup", {"name": "nope"})
    assert unknown.status_code == 404
    assert (await act(client, server_id, "addSecurityGroup", {})).status_code == 400
    assert (await act(client, server_id, "addSecurityGroup", {"name": " "})).status_code == 400

    in_use = await client.delete(f"{BASE}/security-groups/{web['id']}", headers=MEMBER)
    assert in_use.status_code == 409
    assert in_use.json()["NeutronError"]["type"] == "SecurityGroupInUse"

    for name in ("default", "web"):
        left = await act(client, server_id, "removeSecurityGroup", {"name": name})
        assert left.status_code == 202, left.text
    assert await groups_of(client, server_id) is None
    not_in = await act(client, server_id, "removeSecurityGroup", {"name": "web"})
    assert not_in.status_code == 400
    assert "not associated" in not_in.json()["badRequest"]["message"]
    assert (
        await act(client, server_id, "addSecurityGroup", {"name": web["id"]})
    ).status_code == 202
    assert await groups_of(client, server_id) == ["web"]

    await new_group(client, "dup")
    await new_group(client, "dup")
    ambiguous = await act(client, server_id, "addSecurityGroup", {"name": "dup"})
    assert ambiguous.status_code == 409
    assert "use the group's id" in ambiguous.json()["conflictingRequest"]["message"]

    # Another project's server is not found.
    theirs = await client.post(
        f"/v2.1/servers/{server_id}/action",
        headers=OTHER_MEMBER,
        json={"addSecurityGroup": {"name": "default"}},
    )
    assert theirs.status_code == 404


async def test_each_action_run_twice_at_once_changes_the_server_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    await new_group(client, "db")
    for action, expected in (
        ("addSecurityGroup", ["default", "db"]),
        ("removeSecurityGroup", ["default"]),
    ):
        answers = await asyncio.gather(
            *(act(client, server_id, action, {"name": "db"}) for _ in range(2))
        )
        assert sorted(a.status_code for a in answers) == [202, 400]
        assert await groups_of(client, server_id) == expected


async def test_a_group_delete_racing_an_add_never_leaves_a_server_in_a_missing_group(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    group = await new_group(client, "racy")
    added, deleted = await asyncio.gather(
        act(client, server_id, "addSecurityGroup", {"name": group["id"]}),
        client.delete(f"{BASE}/security-groups/{group['id']}", headers=MEMBER),
    )
    if deleted.status_code == 204:
        assert added.status_code in (400, 404), added.text
        assert await groups_of(client, server_id) == ["default"]
    else:
        assert (added.status_code, deleted.status_code) == (202, 409)
        assert await groups_of(client, server_id) == ["default", "racy"]


async def test_a_create_names_its_groups(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    await new_group(client, "app")
    body = server_body("grouped", security_groups=[{"name": "app"}])
    made = await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=body)
    assert made.status_code == 202, made.text
    assert made.json()["server"]["security_groups"] == [{"name": "app"}]
    assert await groups_of(client, made.json()["server"]["id"]) == ["app"]
    missing = server_body("lost", security_groups=[{"name": "nowhere"}])
    refused = await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=missing)
    assert refused.status_code == 400
    assert refused.json()["badRequest"]["message"] == "Security group nowhere not found."
    # An admin sees every project's created groups.
    listed = (await client.get(f"{BASE}/security-groups", headers=ADMIN)).json()
    assert "app" in [g["name"] for g in listed["security_groups"]]
