"""os-aggregates through the API: hosts, metadata, and availability zones from them."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def new_aggregate(client: httpx.AsyncClient, name: str, zone: str | None = None) -> int:
    made = await client.post(
        "/v2.1/os-aggregates",
        headers=ADMIN,
        json={"aggregate": {"name": name, "availability_zone": zone}},
    )
    assert made.status_code == 200, made.text
    found: int = made.json()["aggregate"]["id"]
    return found


async def act(client: httpx.AsyncClient, aggregate: int, **action: Any) -> httpx.Response:
    return await client.post(
        f"/v2.1/os-aggregates/{aggregate}/action", headers=at("2.41"), json=action
    )


async def zones(client: httpx.AsyncClient) -> dict[str, list[str]]:
    found = await client.get("/v2.1/os-availability-zone/detail", headers=ADMIN)
    return {
        zone["zoneName"]: sorted(zone["hosts"] or {})
        for zone in found.json()["availabilityZoneInfo"]
        if zone["zoneName"] != "internal"
    }


async def test_hosts_take_their_aggregates_zone_and_leave_it(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "compute-2")
    aggregate = await new_aggregate(client, "rack-1", "east")
    assert await zones(client) == {"nova": ["compute-1", "compute-2"]}

    added = await act(client, aggregate, add_host={"host": "compute-1"})
    assert added.status_code == 200, added.text
    body = added.json()["aggregate"]
    assert (body["hosts"], body["availability_zone"]) == (["compute-1"], "east")
    assert body["metadata"] == {"availability_zone": "east"}
    assert "uuid" in body
    assert await zones(client) == {"east": ["compute-1"], "nova": ["compute-2"]}

    again = await act(client, aggregate, add_host={"host": "compute-1"})
    assert again.status_code == 409
    unknown = await act(client, aggregate, add_host={"host": "nowhere"})
    assert unknown.status_code == 404
    refused = await client.delete(f"/v2.1/os-aggregates/{aggregate}", headers=ADMIN)
    assert refused.status_code == 400

    other = await new_aggregate(client, "rack-2", "west")
    clash = await act(client, other, add_host={"host": "compute-1"})
    assert clash.status_code == 400
    assert "a host has one zone" in clash.json()["badRequest"]["message"]

    removed = await act(client, aggregate, remove_host={"host": "compute-1"})
    assert removed.json()["aggregate"]["hosts"] == []
    assert await zones(client) == {"nova": ["compute-1", "compute-2"]}
    missing = await act(client, aggregate, remove_host={"host": "compute-1"})
    assert missing.status_code == 404
    deleted = await client.delete(f"/v2.1/os-aggregates/{aggregate}", headers=ADMIN)
    assert deleted.status_code == 200
    assert (await client.get(f"/v2.1/os-aggregates/{aggregate}", headers=ADMIN)).status_code == 404


async def test_metadata_update_and_list(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    await add_compute(db_pool, "compute-1")
    aggregate = await new_aggregate(client, "ssd")
    await act(client, aggregate, add_host={"host": "compute-1"})
    set_ = await act(client, aggregate, set_metadata={"metadata": {"ssd": "true", "x": "1"}})
    assert set_.json()["aggregate"]["metadata"] == {"ssd": "true", "x": "1"}
    unset = await act(client, aggregate, set_metadata={"metadata": {"x": None}})
    assert unset.json()["aggregate"]["metadata"] == {"ssd": "true"}
    zoned = await act(client, aggregate, set_metadata={"metadata": {"availability_zone": "z9"}})
    assert zoned.json()["aggregate"]["availability_zone"] == "z9"
    assert "z9" in await zones(client)

    renamed = await client.put(
        f"/v2.1/os-aggregates/{aggregate}",
        headers=ADMIN,
        json={"aggregate": {"name": "fast", "availability_zone": "z8"}},
    )
    assert renamed.status_code == 200, renamed.text
    assert (renamed.json()["aggregate"]["name"], await zones(client)) == (
        "fast",
        {"z8": ["compute-1"]},
    )
    listed = await client.get("/v2.1/os-aggregates", headers=ADMIN)
    assert [a["name"] for a in listed.json()["aggregates"]] == ["fast"]
    duplicate = await client.post(
        "/v2.1/os-aggregates", headers=ADMIN, json={"aggregate": {"name": "fast"}}
    )
    assert duplicate.status_code == 409
    members = await client.get("/v2.1/os-aggregates", headers=MEMBER)
    assert members.status_code == 403


async def test_a_zone_does_not_change_under_servers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "compute-1")
    server = await create(client)
    await place_on(db_pool, server, node)
    aggregate = await new_aggregate(client, "rack", "east")
    refused = await act(client, aggregate, add_host={"host": "compute-1"})
    assert refused.status_code == 400
    assert "it has servers" in refused.json()["badRequest"]["message"]
    plain = await new_aggregate(client, "plain")
    assert (await act(client, plain, add_host={"host": "compute-1"})).status_code == 200
    zoning = await act(client, plain, set_metadata={"metadata": {"availability_zone": "x"}})
    assert zoning.status_code == 400


async def test_concurrent_adds_never_put_a_host_in_two_zones(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "compute-1")
    east = await new_aggregate(client, "east", "east")
    west = await new_aggregate(client, "west", "west")
    answers = await asyncio.gather(
        act(client, east, add_host={"host": "compute-1"}),
        act(client, west, add_host={"host": "compute-1"}),
    )
    assert sorted(a.status_code for a in answers) == [200, 400]
    assert len(await zones(client)) == 1
