"""Private flavors and their access lists (os-flavor-access) through the API."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional


async def private_flavor(client: httpx.AsyncClient, flavor_id: str = "private-1") -> None:
    made = await client.post(
        "/v2.1/flavors",
        headers=ADMIN,
        json={
            "flavor": {
                "name": flavor_id,
                "id": flavor_id,
                "ram": 256,
                "vcpus": 1,
                "disk": 1,
                "os-flavor-access:is_public": False,
            }
        },
    )
    assert made.status_code == 200, made.text


async def change(
    client: httpx.AsyncClient, action: str, project: str, flavor: str = "private-1"
) -> httpx.Response:
    return await client.post(
        f"/v2.1/flavors/{flavor}/action", headers=at("2.7"), json={action: {"tenant": project}}
    )


async def member_sees(client: httpx.AsyncClient) -> bool:
    listed = await client.get("/v2.1/flavors", headers=MEMBER)
    ids = {f["id"] for f in listed.json()["flavors"]}
    shown = await client.get("/v2.1/flavors/private-1", headers=MEMBER)
    assert ("private-1" in ids) == (shown.status_code == 200)
    return "private-1" in ids


async def test_a_project_on_the_list_sees_and_uses_the_private_flavor(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    await private_flavor(client)
    assert not await member_sees(client)
    refused = await client.post(
        "/v2.1/servers", headers=MEMBER, json=server_body(flavorRef="private-1")
    )
    assert refused.status_code == 400

    added = await asyncio.gather(
        change(client, "addTenantAccess", "team"), change(client, "addTenantAccess", "team")
    )
    assert sorted(a.status_code for a in added) == [200, 409]
    listed = await client.get("/v2.1/flavors/private-1/os-flavor-access", headers=ADMIN)
    assert listed.json() == {"flavor_access": [{"flavor_id": "private-1", "tenant_id": "team"}]}
    assert await member_sees(client)
    made = await client.post(
        "/v2.1/servers", headers=MEMBER, json=server_body(flavorRef="private-1")
    )
    assert made.status_code == 202, made.text

    removed = await change(client, "removeTenantAccess", "team")
    assert removed.json() == {"flavor_access": []}
    assert not await member_sees(client)
    assert (await change(client, "removeTenantAccess", "team")).status_code == 404


async def test_public_flavors_have_no_list_and_members_may_not_change_one(
    client: httpx.AsyncClient,
) -> None:
    await private_flavor(client)
    public = await client.get("/v2.1/flavors/1/os-flavor-access", headers=ADMIN)
    assert public.status_code == 404
    assert (await change(client, "addTenantAccess", "team", "1")).status_code == 409
    old = await client.post(
        "/v2.1/flavors/1/action", headers=at("2.6"), json={"addTenantAccess": {"tenant": "x"}}
    )
    assert old.status_code == 200
    by_member = await client.post(
        "/v2.1/flavors/private-1/action",
        headers=MEMBER,
        json={"addTenantAccess": {"tenant": "team"}},
    )
    assert by_member.status_code == 403
    assert (await change(client, "addTenantAccess", "team", "missing")).status_code == 404
