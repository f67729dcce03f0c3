"""os-server-groups through the API, and servers joining them with the ``group`` hint."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.db import allocations
from shared.objects.flavor import FlavorSnapshot
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

TINY = FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1)


async def new_group(
    client: httpx.AsyncClient,
    version: str = "2.64",
    headers: dict[str, str] = MEMBER,
    **fields: Any,
) -> httpx.Response:
    body = fields or {"name": "web", "policy": "anti-affinity"}
    return await client.post(
        "/v2.1/os-server-groups", headers=at(version, headers), json={"server_group": body}
    )


async def group_id(client: httpx.AsyncClient, **fields: Any) -> str:
    made = await new_group(client, **fields)
    assert made.status_code == 200, made.text
    found: str = made.json()["server_group"]["id"]
    return found


async def test_create_show_list_delete_at_2_1_2_13_and_2_64(client: httpx.AsyncClient) -> None:
    old = await new_group(client, "2.1", name="old", policies=["affinity"])
    assert old.status_code == 200, old.text
    assert old.json()["server_group"] == {
        "id": old.json()["server_group"]["id"],
        "name": "old",
        "policies": ["affinity"],
        "members": [],
        "metadata": {},
    }
    made = await new_group(
        client, name="spread", policy="anti-affinity", rules={"max_server_per_host": 2}
    )
    group = made.json()["server_group"]
    assert (group["policy"], group["rules"], group["project_id"]) == (
        "anti-affinity",
        {"max_server_per_host": 2},
        "team",
    )
    assert "policies" not in group
    assert "metadata" not in group

    shown = await client.get(f"/v2.1/os-server-groups/{group['id']}", headers=at("2.13", MEMBER))
    assert shown.json()["server_group"]["policies"] == ["anti-affinity"]
    assert shown.json()["server_group"]["user_id"] == "alice"
    listed = await client.get("/v2.1/os-server-groups", headers=at("2.64", MEMBER))
    assert [g["name"] for g in listed.json()["server_groups"]] == ["old", "spread"]
    paged = await client.get("/v2.1/os-server-groups?limit=1&offset=1", headers=MEMBER)
    assert [g["name"] for g in paged.json()["server_groups"]] == ["spread"]

    theirs = await client.get(f"/v2.1/os-server-groups/{group['id']}", headers=OTHER_MEMBER)
    assert theirs.status_code == 404
    assert (await client.get("/v2.1/os-server-groups", headers=OTHER_MEMBER)).json() == {
        "server_groups": []
    }
    admins_own = await client.get("/v2.1/os-server-groups", headers=ADMIN)
    assert admins_own.json()["server_groups"] == []
    every = await client.get("/v2.1/os-server-groups?all_projects=True", headers=ADMIN)
    assert len(every.json()["server_groups"]) == 2

    deleted = await client.delete(f"/v2.1/os-server-groups/{group['id']}", headers=MEMBER)
    assert deleted.status_code == 204
    again = await client.delete(f"/v2.1/os-server-groups/{group['id']}", headers=MEMBER)
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("version", "fields", "message"),
    [
        ("2.14", {"name": "g", "policies": ["soft-affinity"]}, "policies"),
        ("2.15", {"name": "g", "policies": ["affinity", "anti-affinity"]}, "exactly one"),
        ("2.15", {"name": "g", "policy": "affinity"}, "'policy'"),
        ("2.64", {"name": "g", "policies": ["affinity"]}, "'policies'"),
        ("2.64", {"name": "g", "policy": "packed"}, "policy"),
        ("2.64", {"name": "", "policy": "affinity"}, "name"),
        ("2.64", {"name": " g", "policy": "affinity"}, "name"),
        ("2.64", {"name": "g", "policy": "affinity", "rules": {"max_server_per_host": 2}}, "Only"),
        ("2.64", {"name": "g", "policy": "anti-affinity", "rules": {"max_server_per_host": 0}}, ""),
        ("2.64", {"name": "g", "policy": "anti-affinity", "rules": {"other": 1}}, "rules"),
    ],
)
async def test_bad_groups_are_400(
    client: httpx.AsyncClient, version: str, fields: dict[str, Any], message: str
) -> None:
    refused = await new_group(client, version, **fields)
    assert refused.status_code == 400, refused.text
    assert message in refused.json()["badRequest"]["message"]


async def test_the_server_groups_quota_holds_under_concurrent_creates(
    client: httpx.AsyncClient,
) -> None:
    limited = await client.put(
        "/v2.1/os-quota-sets/team", headers=ADMIN, json={"quota_set": {"server_groups": 2}}
    )
    assert limited.status_code == 200, limited.text
    answers = await asyncio.gather(*(new_group(client) for _ in range(5)))
    assert sorted(a.status_code for a in answers) == [200, 200, 403, 403, 403]
    detail = await client.get("/v2.1/os-quota-sets/team/detail", headers=MEMBER)
    assert detail.json()["quota_set"]["server_groups"]["in_use"] == 2
    limits = await client.get("/v2.1/limits", headers=MEMBER)
    assert limits.json()["limits"]["absolute"]["totalServerGroupsUsed"] == 2


def with_group(group: str, name: str = "web", **extra: Any) -> dict[str, Any]:
    return {**server_body(name, **extra), "os:scheduler_hints": {"group": group}}


async def test_servers_join_their_group_and_show_it_from_2_71(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    group = await group_id(client)
    made = await client.post(
        "/v2.1/servers",
        headers=at("2.71", MEMBER),
        json=with_group(group, min_count=2, max_count=2),
    )
    assert made.status_code == 202, made.text
    server = made.json()["server"]["id"]
    shown = await client.get(f"/v2.1/servers/{server}", headers=at("2.71", MEMBER))
    assert shown.json()["server"]["server_groups"] == [group]
    older = await client.get(f"/v2.1/servers/{server}", headers=at("2.70", MEMBER))
    assert "server_groups" not in older.json()["server"]
    members = (await client.get(f"/v2.1/os-server-groups/{group}", headers=MEMBER)).json()
    assert server in members["server_group"]["members"]
    assert len(members["server_group"]["members"]) == 2

    await client.delete(f"/v2.1/servers/{server}", headers=MEMBER)
    members = (await client.get(f"/v2.1/os-server-groups/{group}", headers=MEMBER)).json()
    assert server not in members["server_group"]["members"]


async def test_a_missing_or_foreign_group_is_400_and_records_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    theirs = await group_id(client, headers=OTHER_MEMBER)
    for hint in (str(uuid.uuid4()), theirs, "not-a-uuid"):
        refused = await client.post("/v2.1/servers", headers=MEMBER, json=with_group(hint))
        assert refused.status_code == 400, refused.text
    listed = await client.get("/v2.1/servers", headers=MEMBER)
    assert listed.json()["servers"] == []


async def test_the_members_quota_holds_under_concurrent_creates(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    await client.put(
        "/v2.1/os-quota-sets/team", headers=ADMIN, json={"quota_set": {"server_group_members": 3}}
    )
    group = await group_id(client)
    answers = await asyncio.gather(
        *(
            client.post("/v2.1/servers", headers=MEMBER, json=with_group(group, f"s{i}"))
            for i in range(6)
        )
    )
    assert sorted(a.status_code for a in answers) == [202, 202, 202, 403, 403, 403]
    members = (await client.get(f"/v2.1/os-server-groups/{group}", headers=MEMBER)).json()
    assert len(members["server_group"]["members"]) == 3


async def test_a_requested_host_that_breaks_the_policy_is_refused_with_the_reason(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    _, taken = await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "compute-2")
    group = await group_id(client, headers=ADMIN)
    first = await client.post("/v2.1/servers", headers=at("2.74"), json=with_group(group, "a"))
    first_id = first.json()["server"]["id"]
    await place_on(db_pool, first_id, taken)
    async with db_pool.acquire() as conn:
        assert await allocations.claim(conn, taken.id, uuid.UUID(first_id), TINY)

    refused = await client.post(
        "/v2.1/servers", headers=at("2.74"), json=with_group(group, "b", host="compute-1")
    )
    assert refused.status_code == 400, refused.text
    message = refused.json()["badRequest"]["message"]
    assert "anti-affinity policy of server group web" in message
    assert f"host compute-1 holds 1 ({first_id})" in message

    allowed = await client.post(
        "/v2.1/servers", headers=at("2.74"), json=with_group(group, "c", host="compute-2")
    )
    assert allowed.status_code == 202, allowed.text


async def test_a_group_hint_waits_for_every_scheduler_to_honour_groups(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport, conductor: Recorder
) -> None:
    """While a scheduler of a release before server groups runs, it would place a member
    without the policy: the create is refused with 409, nothing recorded."""
    await add_image(db_pool)
    app = create_app(
        settings, db_pool, ConductorAPI(transport), ComputeAPI(transport), scheduler_cap="1.2"
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as old:
        group = await group_id(old)
        refused = await old.post("/v2.1/servers", headers=MEMBER, json=with_group(group))
        assert refused.status_code == 409, refused.text
        assert "server groups need 1.3" in refused.json()["conflictingRequest"]["message"]
        assert (await old.get("/v2.1/servers", headers=MEMBER)).json()["servers"] == []
        plain = await old.post("/v2.1/servers", headers=MEMBER, json=server_body())
        assert plain.status_code == 202
