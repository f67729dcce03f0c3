"""Metadata and tags routes, and PUT /servers/{id}, against PostgreSQL."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.config import Settings
from shared.db import instances
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def active_server(client: httpx.AsyncClient, pool: asyncpg.Pool) -> str:
    await add_image(pool)
    server_id = await create(client)
    _, node = await add_compute(pool, "compute-1")
    async with pool.acquire() as conn:
        await instances.set_scheduled(
            conn, UUID(server_id), host="compute-1", node="compute-1", compute_id=node.id
        )
        assert await instances.set_active(conn, UUID(server_id)) is not None
    return server_id


async def test_metadata_is_set_merged_replaced_read_and_deleted(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    base = f"/v2.1/servers/{server_id}/metadata"

    merged = await client.post(base, headers=MEMBER, json={"metadata": {"a": "1", "b": "2"}})
    assert merged.status_code == 200
    assert merged.json() == {"metadata": {"a": "1", "b": "2"}}
    merged = await client.post(base, headers=MEMBER, json={"metadata": {"b": "3", "c": "4"}})
    assert merged.json() == {"metadata": {"a": "1", "b": "3", "c": "4"}}

    item = await client.put(f"{base}/d", headers=MEMBER, json={"meta": {"d": "5"}})
    assert item.status_code == 200
    assert item.json() == {"meta": {"d": "5"}}
    assert (await client.get(f"{base}/d", headers=MEMBER)).json() == {"meta": {"d": "5"}}

    assert (await client.delete(f"{base}/a", headers=MEMBER)).status_code == 204
    missing = await client.delete(f"{base}/a", headers=MEMBER)
    assert missing.status_code == 404
    assert missing.json()["itemNotFound"]["message"] == "Metadata item was not found"
    assert (await client.get(f"{base}/a", headers=MEMBER)).status_code == 404
    assert (await client.get(base, headers=MEMBER)).json() == {
        "metadata": {"b": "3", "c": "4", "d": "5"}
    }

    replaced = await client.put(base, headers=MEMBER, json={"metadata": {"only": "one"}})
    assert replaced.json() == {"metadata": {"only": "one"}}
    shown = await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)
    assert shown.json()["server"]["metadata"] == {"only": "one"}


async def test_concurrent_metadata_changes_are_all_kept(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    base = f"/v2.1/servers/{server_id}/metadata"
    await asyncio.gather(
        *(
            client.put(f"{base}/k{i}", headers=MEMBER, json={"meta": {f"k{i}": "v"}})
            for i in range(10)
        )
    )
    assert (await client.get(base, headers=MEMBER)).json()["metadata"] == {
        f"k{i}": "v" for i in range(10)
    }


async def test_bad_metadata_is_400_and_a_building_server_409(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    base = f"/v2.1/servers/{server_id}/metadata"
    for body in (
        {"metadata": "x"},
        {"metadata": {"k": 1}},
        {"metadata": {"k": "v" * 256}},
        {"metadata": {"k" * 256: "v"}},
        {"metadata": {"": "v"}},
        {"meta": {"k": "v"}},
    ):
        response = await client.post(base, headers=MEMBER, json=body)
        assert response.status_code == 400, body
    mismatch = await client.put(f"{base}/a", headers=MEMBER, json={"meta": {"b": "1"}})
    assert mismatch.json()["badRequest"]["message"] == "Request body and URI mismatch"
    many = await client.put(f"{base}/a", headers=MEMBER, json={"meta": {"a": "1", "b": "2"}})
    assert many.json()["badRequest"]["message"] == "Request body contains too many items"

    building = await create(client, "still-building")
    response = await client.post(
        f"/v2.1/servers/{building}/metadata", headers=MEMBER, json={"metadata": {"a": "1"}}
    )
    assert response.status_code == 409
    assert "vm_state building" in response.json()["conflictingRequest"]["message"]
    hidden = await client.get(base, headers=OTHER_MEMBER)
    assert hidden.status_code == 404


async def test_tags_from_2_26(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    base = f"/v2.1/servers/{server_id}/tags"
    v = at("2.26", MEMBER)
    assert (await client.get(base, headers=at("2.25", MEMBER))).status_code == 404

    replaced = await client.put(base, headers=v, json={"tags": ["a", "b", "a"]})
    assert replaced.json() == {"tags": ["a", "b"]}
    added = await client.put(f"{base}/c", headers=v)
    assert added.status_code == 201
    assert added.headers["Location"].endswith(f"/v2.1/servers/{server_id}/tags/c")
    assert (await client.put(f"{base}/c", headers=v)).status_code == 204
    assert (await client.get(f"{base}/c", headers=v)).status_code == 204
    assert (await client.get(f"{base}/zzz", headers=v)).status_code == 404
    assert (await client.delete(f"{base}/a", headers=v)).status_code == 204
    assert (await client.delete(f"{base}/a", headers=v)).status_code == 404
    assert (await client.get(base, headers=v)).json() == {"tags": ["b", "c"]}
    shown = await client.get(f"/v2.1/servers/{server_id}", headers=v)
    assert shown.json()["server"]["tags"] == ["b", "c"]
    assert (await client.delete(base, headers=v)).status_code == 204
    assert (await client.get(base, headers=v)).json() == {"tags": []}


async def test_bad_tags_and_too_many_are_400(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    base = f"/v2.1/servers/{server_id}/tags"
    v = at("2.26", MEMBER)
    bad = await client.put(f"{base}/a,b", headers=v)
    assert bad.status_code == 400
    assert bad.json()["badRequest"]["message"].startswith("Tag 'a,b' is invalid")
    assert (await client.put(base, headers=v, json={"tags": ["x" * 61]})).status_code == 400
    assert (await client.put(base, headers=v, json={"tags": "x"})).status_code == 400
    fifty = [f"t{i}" for i in range(50)]
    assert (
        await client.put(base, headers=v, json={"tags": [*fifty, "one-more"]})
    ).status_code == 400
    assert (await client.put(base, headers=v, json={"tags": fifty})).status_code == 200
    full = await client.put(f"{base}/one-more", headers=v)
    assert full.status_code == 400
    assert (
        full.json()["badRequest"]["message"]
        == "The number of tags exceeded the per-server limit 50"
    )


async def test_rename_and_describe(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    url = f"/v2.1/servers/{server_id}"
    renamed = await client.put(url, headers=MEMBER, json={"server": {"name": "web-2"}})
    assert renamed.status_code == 200
    assert renamed.json()["server"]["name"] == "web-2"
    refused = await client.put(
        url, headers=at("2.18", MEMBER), json={"server": {"description": "d"}}
    )
    assert refused.status_code == 400
    assert "'description' was unexpected" in refused.json()["badRequest"]["message"]
    described = await client.put(
        url, headers=at("2.19", MEMBER), json={"server": {"description": "front end"}}
    )
    assert described.json()["server"]["description"] == "front end"
    assert described.json()["server"]["name"] == "web-2"
    cleared = await client.put(
        url, headers=at("2.19", MEMBER), json={"server": {"description": None}}
    )
    assert cleared.json()["server"]["description"] is None
    for body in (
        {"server": {"name": ""}},
        {"server": {"name": " padded"}},
        {"server": {"name": None}},
        {"server": {"accessIPv4": "1.2.3.4.5"}},
        {"server": {"accessIPv4": "::1"}},
        {"server": {"accessIPv6": "1.2.3.4"}},
        {"server": {"accessIPv4": None}},
        {"server": {"accessIPv4": 16909060}},
        {"server": {"diskConfig": "AUTO"}},
        {"server": {"description": "x" * 256}},
        {"name": "x"},
    ):
        response = await client.put(url, headers=at("2.19", MEMBER), json=body)
        assert response.status_code == 400, body
    assert (
        await client.put(url, headers=OTHER_MEMBER, json={"server": {"name": "x"}})
    ).status_code == 404


async def test_metadata_beyond_the_quota_is_403_and_changes_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    base = f"/v2.1/servers/{server_id}/metadata"
    quota = {"quota_set": {"metadata_items": 2}}
    set_quota = await client.put("/v2.1/os-quota-sets/team", headers=ADMIN, json=quota)
    assert set_quota.status_code == 200, set_quota.text
    two = {"metadata": {"a": "1", "b": "2"}}
    assert (await client.post(base, headers=MEMBER, json=two)).status_code == 200

    over = await client.post(base, headers=MEMBER, json={"metadata": {"c": "3"}})
    one_more = await client.put(f"{base}/c", headers=MEMBER, json={"meta": {"c": "3"}})

    assert over.status_code == 403
    assert "Maximum number of metadata items exceeds 2" in over.text
    assert one_more.status_code == 403
    assert (await client.get(base, headers=MEMBER)).json() == two


async def test_an_update_answers_with_novas_update_view(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    url = f"/v2.1/servers/{server_id}"
    for version, headers in (("2.1", MEMBER), ("2.74", MEMBER), ("2.74", ADMIN)):
        answer = await client.put(url, headers=at(version, headers), json={"server": {}})
        assert answer.status_code == 200, answer.text
        server = answer.json()["server"]
        assert not [key for key in server if key.startswith(("OS-EXT-", "OS-SRV-USG", "os-"))]
        for absent in ("key_name", "config_drive", "security_groups", "host_status"):
            assert absent not in server
        assert server["OS-DCF:diskConfig"] == "MANUAL"
        assert {"id", "name", "status", "addresses", "accessIPv4", "flavor"} <= set(server)
        for addresses in server["addresses"].values():
            assert all(set(a) == {"version", "addr"} for a in addresses)
        shown = (await client.get(url, headers=at(version, headers))).json()["server"]
        assert "OS-EXT-STS:vm_state" in shown
    assert server["server_groups"] == []
    assert server["locked_reason"] is None


async def test_ips_list_the_addresses_by_network(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    server_id = await active_server(client, db_pool)
    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    [(network, [address])] = shown["addresses"].items()
    expected = [{"version": 4, "addr": address["addr"]}]

    ips = await client.get(f"/v2.1/servers/{server_id}/ips", headers=MEMBER)
    assert ips.status_code == 200, ips.text
    assert ips.json() == {"addresses": {network: expected}}
    one = await client.get(f"/v2.1/servers/{server_id}/ips/{network}", headers=MEMBER)
    assert one.json() == {network: expected}

    other = await client.get(f"/v2.1/servers/{server_id}/ips/elsewhere", headers=MEMBER)
    assert other.status_code == 404
    assert other.json()["itemNotFound"]["message"] == "There's no network with this label."
    foreign = await client.get(f"/v2.1/servers/{server_id}/ips", headers=OTHER_MEMBER)
    assert foreign.status_code == 404


async def test_with_a_forward_name_the_ssh_forward_is_a_second_network(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder, settings: Settings
) -> None:
    settings.network = settings.network.model_copy(update={"forward_name": "forwarded"})
    server_id = await active_server(client, db_pool)

    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    ips = (await client.get(f"/v2.1/servers/{server_id}/ips", headers=MEMBER)).json()
    one = await client.get(f"/v2.1/servers/{server_id}/ips/forwarded", headers=MEMBER)

    [fixed] = shown["addresses"][settings.network.name]
    [forward] = shown["addresses"]["forwarded"]
    assert forward["addr"] == "127." + fixed["addr"].split(".", 1)[1]
    assert forward["OS-EXT-IPS-MAC:mac_addr"] == fixed["OS-EXT-IPS-MAC:mac_addr"]
    assert ips["addresses"]["forwarded"] == [{"version": 4, "addr": forward["addr"]}]
    assert one.json() == {"forwarded": [{"version": 4, "addr": forward["addr"]}]}
