"""Quotas through the API: os-quota-sets, limits, and server creation held to them."""

from __future__ import annotations

import asyncio

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
from tests.functional.services.api.test_keypairs import PUBLIC_KEY
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

DEFAULTS = {
    "cores": 20,
    "instances": 10,
    "key_pairs": 100,
    "metadata_items": 128,
    "ram": 51200,
    "server_group_members": 10,
    "server_groups": 10,
}
INJECTED = {
    "injected_file_content_bytes": 10240,
    "injected_file_path_bytes": 255,
    "injected_files": 5,
}


async def set_quota(client: httpx.AsyncClient, project: str, **limits: object) -> httpx.Response:
    return await client.put(
        f"/v2.1/os-quota-sets/{project}", headers=at("2.57", ADMIN), json={"quota_set": limits}
    )


async def create_server(
    client: httpx.AsyncClient, name: str, headers: dict[str, str] = MEMBER, **extra: object
) -> httpx.Response:
    return await client.post(
        "/v2.1/servers", headers=at("2.73", headers), json=server_body(name, **extra)
    )


async def test_show_defaults_and_detail_follow_the_microversion(
    client: httpx.AsyncClient,
) -> None:
    shown = await client.get("/v2.1/os-quota-sets/team", headers=at("2.57", MEMBER))
    assert shown.json()["quota_set"] == {"id": "team", **DEFAULTS}
    older = await client.get("/v2.1/os-quota-sets/team", headers=at("2.56", MEMBER))
    assert older.json()["quota_set"] == {"id": "team", **DEFAULTS, **INJECTED}
    defaults = await client.get("/v2.1/os-quota-sets/team/defaults", headers=at("2.57", MEMBER))
    assert defaults.json()["quota_set"] == {"id": "team", **DEFAULTS}
    detail = await client.get("/v2.1/os-quota-sets/team/detail", headers=at("2.57", MEMBER))
    assert detail.json()["quota_set"]["instances"] == {"limit": 10, "in_use": 0, "reserved": 0}


async def test_members_read_only_their_own_quotas_and_set_none(client: httpx.AsyncClient) -> None:
    other = await client.get("/v2.1/os-quota-sets/team", headers=at("2.57", OTHER_MEMBER))
    assert other.status_code == 403
    refused = await client.put(
        "/v2.1/os-quota-sets/team", headers=MEMBER, json={"quota_set": {"instances": 50}}
    )
    assert refused.status_code == 403


async def test_set_then_revert(client: httpx.AsyncClient) -> None:
    updated = await set_quota(client, "team", instances=3, cores="8", ram=-1)
    assert updated.status_code == 200, updated.text
    assert updated.json()["quota_set"] == {**DEFAULTS, "instances": 3, "cores": 8, "ram": -1}
    shown = await client.get("/v2.1/os-quota-sets/team", headers=at("2.57", ADMIN))
    assert shown.json()["quota_set"]["instances"] == 3
    reverted = await client.delete("/v2.1/os-quota-sets/team", headers=ADMIN)
    assert reverted.status_code == 202
    again = await client.get("/v2.1/os-quota-sets/team", headers=at("2.57", ADMIN))
    assert again.json()["quota_set"]["instances"] == 10


@pytest.mark.parametrize(
    "limits",
    [
        {"instances": -2},
        {"cores": "-5"},
        {"ram": 2**31},
        {"instances": 1.5},
        {"instances": True},
        {"instances": "many"},
        {"bogus": 1},
        {"injected_files": 3},
        {"floating_ips": 10},
        {"instances": 3, "force": "perhaps"},
    ],
)
async def test_bad_updates_are_400(client: httpx.AsyncClient, limits: dict[str, object]) -> None:
    response = await set_quota(client, "team", **limits)
    assert response.status_code == 400, response.text
    assert response.json()["badRequest"]["message"]


async def test_bad_requests_for_quota_sets(client: httpx.AsyncClient) -> None:
    unknown = await client.get("/v2.1/os-quota-sets/no-such-project", headers=ADMIN)
    assert unknown.status_code == 400
    assert "is not a valid project" in unknown.json()["badRequest"]["message"]
    empty_user = await client.get("/v2.1/os-quota-sets/team?user_id=", headers=ADMIN)
    assert empty_user.status_code == 400
    not_json = await client.put("/v2.1/os-quota-sets/team", headers=ADMIN, content=b"{", params={})
    assert not_json.status_code == 400


async def test_over_quota_create_is_403_and_leaves_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    assert (await set_quota(client, "team", instances=1)).status_code == 200
    assert (await create_server(client, "first")).status_code == 202
    refused = await create_server(client, "second")
    assert refused.status_code == 403
    assert refused.json()["forbidden"]["message"] == (
        "Quota exceeded for instances: Requested 1, but already used 1 of 1 instances"
    )
    async with db_pool.acquire() as conn:
        names = await conn.fetch("SELECT display_name FROM instances")
        specs = await conn.fetchval("SELECT count(*) FROM request_specs")
    assert [row["display_name"] for row in names] == ["first"]
    assert specs == 1
    lowered = await set_quota(client, "team", instances=0)
    assert lowered.status_code == 400
    assert "already used and reserved 1" in lowered.json()["badRequest"]["message"]
    forced = await set_quota(client, "team", instances=0, force=True)
    assert forced.status_code == 200


async def test_cores_and_ram_are_counted_from_flavors(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    assert (await set_quota(client, "team", cores=1, ram=600)).status_code == 200
    assert (await create_server(client, "one")).status_code == 202
    refused = await create_server(client, "two")
    assert refused.status_code == 403
    assert refused.json()["forbidden"]["message"] == (
        "Quota exceeded for cores, ram: Requested 1, 512, but already used 1, 512 of 1, 600 "
        "cores, ram"
    )
    limits = await client.get("/v2.1/limits", headers=at("2.57", MEMBER))
    absolute = limits.json()["limits"]["absolute"]
    assert absolute["maxTotalCores"] == 1
    assert absolute["totalCoresUsed"] == 1
    assert absolute["totalRAMUsed"] == 512
    assert absolute["totalInstancesUsed"] == 1
    assert "maxPersonality" not in absolute


async def test_concurrent_creates_never_exceed_the_quota(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    assert (await set_quota(client, "team", instances=3)).status_code == 200
    answers = await asyncio.gather(*(create_server(client, f"s{i}") for i in range(10)))
    assert sorted(a.status_code for a in answers) == [202] * 3 + [403] * 7
    async with db_pool.acquire() as conn:
        rows = await conn.fetchval("SELECT count(*) FROM instances WHERE project_id = 'team'")
    assert rows == 3


async def test_limits_of_another_project_are_for_admins(client: httpx.AsyncClient) -> None:
    older = await client.get("/v2.1/limits", headers=MEMBER)
    absolute = older.json()["limits"]["absolute"]
    assert absolute["maxTotalInstances"] == 10
    assert absolute["maxSecurityGroups"] == -1
    assert absolute["maxPersonality"] == 5
    assert older.json()["limits"]["rate"] == []
    assert (await client.get("/v2.1/limits?tenant_id=elsewhere", headers=MEMBER)).status_code == 403
    theirs = await client.get("/v2.1/limits?tenant_id=elsewhere", headers=ADMIN)
    assert theirs.status_code == 200


async def test_key_name_is_stored_and_shown(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    made = await client.post(
        "/v2.1/os-keypairs",
        headers=at("2.10", MEMBER),
        json={"keypair": {"name": "laptop", "public_key": PUBLIC_KEY}},
    )
    assert made.status_code == 201
    unknown = await create_server(client, "nokey", key_name="missing")
    assert unknown.status_code == 400
    assert unknown.json()["badRequest"]["message"] == "Invalid key_name provided."
    theirs = await create_server(client, "theirs", headers=OTHER_MEMBER, key_name="laptop")
    assert theirs.status_code == 400
    created = await create_server(client, "keyed", key_name="laptop")
    assert created.status_code == 202
    server_id = created.json()["server"]["id"]
    shown = await client.get(f"/v2.1/servers/{server_id}", headers=at("2.73", MEMBER))
    assert shown.json()["server"]["key_name"] == "laptop"
    listed = await client.get("/v2.1/servers/detail", headers=at("2.73", MEMBER))
    assert [s["key_name"] for s in listed.json()["servers"]] == ["laptop"]
    async with db_pool.acquire() as conn:
        key_data = await conn.fetchval("SELECT key_data FROM instances WHERE key_name = 'laptop'")
        count = await conn.fetchval("SELECT count(*) FROM instances")
    assert key_data == PUBLIC_KEY
    assert count == 1


async def test_per_user_quotas_follow_the_project_until_set(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    assert (await set_quota(client, "team", instances=5)).status_code == 200
    url = "/v2.1/os-quota-sets/team"
    alice = await client.get(url, headers=at("2.57", MEMBER), params={"user_id": "alice"})
    assert alice.status_code == 200, alice.text
    assert alice.json()["quota_set"] == {"id": "team", **DEFAULTS, "instances": 5}

    too_many = await client.put(
        url, headers=at("2.57", ADMIN), params={"user_id": "alice"},
        json={"quota_set": {"instances": 6}},
    )  # fmt: skip
    assert too_many.status_code == 400
    assert "must be less than or equal to 5" in too_many.json()["badRequest"]["message"]
    unlimited = await client.put(
        url, headers=ADMIN, params={"user_id": "alice"}, json={"quota_set": {"instances": -1}}
    )
    assert unlimited.status_code == 400
    one = await client.put(
        url, headers=at("2.57", ADMIN), params={"user_id": "alice"},
        json={"quota_set": {"instances": 1, "key_pairs": 7}},
    )  # fmt: skip
    assert one.status_code == 200, one.text
    assert one.json()["quota_set"]["instances"] == 1
    assert (await client.get(url, headers=MEMBER)).json()["quota_set"]["instances"] == 5

    assert (await create_server(client, "alices-first")).status_code == 202
    refused = await create_server(client, "alices-second")
    assert refused.status_code == 403, refused.text
    assert "instances" in refused.json()["forbidden"]["message"]
    detail = await client.get(f"{url}/detail", headers=MEMBER, params={"user_id": "alice"})
    assert detail.json()["quota_set"]["instances"] == {"limit": 1, "in_use": 1, "reserved": 0}
    below = await client.put(
        url, headers=ADMIN, params={"user_id": "alice"}, json={"quota_set": {"instances": 0}}
    )
    assert below.status_code == 400

    reset = await client.delete(url, headers=ADMIN, params={"user_id": "alice"})
    assert reset.status_code == 202
    assert (await create_server(client, "alices-second")).status_code == 202
    again = await client.get(url, headers=MEMBER, params={"user_id": "alice"})
    assert again.json()["quota_set"]["key_pairs"] == DEFAULTS["key_pairs"]
