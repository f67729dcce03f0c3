"""Creating servers with metadata, description, tags, user data and a fixed address."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from shared.config import NetworkSettings
from shared.db import fixed_ips
from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

NETWORK = NetworkSettings(cidr="10.0.0.0/24")


async def post(client: httpx.AsyncClient, version: str = "2.73", **fields: Any) -> httpx.Response:
    return await client.post(
        "/v2.1/servers", headers=at(version, MEMBER), json=server_body(**fields)
    )


async def show(client: httpx.AsyncClient, server_id: str, headers: dict[str, str] = MEMBER) -> Any:
    response = await client.get(f"/v2.1/servers/{server_id}", headers=at("2.73", headers))
    assert response.status_code == 200, response.text
    return response.json()["server"]


async def count_instances(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM instances")
    return count


async def test_the_fields_are_stored_shown_and_the_address_allocated(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    response = await post(
        client,
        metadata={"role": "web"},
        description="front end",
        tags=["prod"],
        user_data="IyEvYmluL3NoCmVjaG8gaGkK",
    )
    assert response.status_code == 202, response.text
    created = response.json()["server"]
    assert len(created["adminPass"]) == 12

    server = await show(client, created["id"])
    assert server["metadata"] == {"role": "web"}
    assert server["description"] == "front end"
    assert server["tags"] == ["prod"]
    [address] = server["addresses"]["private"]
    assert address["addr"] == "10.0.0.2"
    assert address["version"] == 4
    assert address["OS-EXT-IPS:type"] == "fixed"
    assert address["OS-EXT-IPS-MAC:mac_addr"].startswith("02:")
    assert "OS-EXT-SRV-ATTR:user_data" not in server
    as_admin = await show(client, created["id"], ADMIN)
    assert as_admin["OS-EXT-SRV-ATTR:user_data"] == "IyEvYmluL3NoCmVjaG8gaGkK"


async def test_an_admin_password_given_is_returned(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    response = await post(client, adminPass="correct horse")
    assert response.json()["server"]["adminPass"] == "correct horse"


async def test_networks_none_gets_no_address_and_a_fixed_ip_is_honoured(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    bare = (await post(client, networks="none")).json()["server"]["id"]
    assert (await show(client, bare))["addresses"] == {}
    wanted = [{"uuid": str(NETWORK.network_id), "fixed_ip": "10.0.0.77"}]
    chosen = (await post(client, networks=wanted)).json()["server"]["id"]
    assert (await show(client, chosen))["addresses"]["private"][0]["addr"] == "10.0.0.77"

    taken = await post(client, networks=wanted)
    assert taken.status_code == 400
    assert taken.json()["badRequest"]["message"] == "Fixed IP address 10.0.0.77 is already in use."


async def test_refused_requests_leave_no_server_and_no_address(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    volume = {"boot_index": 0, "uuid": str(uuid.uuid4()), "source_type": "volume",
              "destination_type": "volume"}  # fmt: skip
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("2.73", {"metadata": "x"}, "metadata must be an object"),
        ("2.73", {"metadata": {"k": 5}}, "must be a string"),
        ("2.73", {"user_data": "%%%"}, "must be base64-encoded"),
        ("2.73", {"networks": [{"uuid": str(uuid.uuid4())}]}, "could not be found"),
        ("2.73", {"networks": [{"port": str(uuid.uuid4())}]}, "Port"),
        (
            "2.73",
            {"networks": [{"uuid": str(NETWORK.network_id), "fixed_ip": "10.1.0.5"}]},
            "is not available on network private",
        ),
        ("2.73", {"block_device_mapping_v2": [volume]}, "Block Device Mapping is Invalid"),
        ("2.73", {"tags": ["a/b"]}, "server.tags"),
        ("2.51", {"tags": ["web"]}, "'tags' was unexpected"),
        ("2.18", {"description": "x"}, "'description' was unexpected"),
    ]
    for version, fields, message in cases:
        response = await post(client, version, **fields)
        assert response.status_code == 400, (fields, response.text)
        assert message in response.json()["badRequest"]["message"], fields
    assert await count_instances(db_pool) == 0
    async with db_pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM fixed_ips WHERE instance_uuid IS NOT NULL")
            == 0
        )


async def test_an_exhausted_network_is_409_and_leaves_no_server(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    async with db_pool.acquire() as conn:
        await fixed_ips.ensure_network(conn, NETWORK)
        await conn.execute("UPDATE fixed_ips SET instance_uuid = gen_random_uuid()")
    before = await count_instances(db_pool)

    response = await post(client)

    assert response.status_code == 409
    message = response.json()["conflictingRequest"]["message"]
    assert message.startswith("No more IP addresses available on network private (10.0.0.0/24)")
    assert await count_instances(db_pool) == before


async def test_a_local_delete_returns_the_address(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = (await post(client)).json()["server"]["id"]
    async with db_pool.acquire() as conn:
        free = (await fixed_ips.usage(conn, NETWORK.network_id)).free

    assert (await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)).status_code == 204

    async with db_pool.acquire() as conn:
        assert (await fixed_ips.usage(conn, NETWORK.network_id)).free == free + 1


async def test_a_create_withdrawn_for_want_of_a_conductor_returns_the_address(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool)
    assert (await post(client)).status_code == 503
    async with db_pool.acquire() as conn:
        usage = await fixed_ips.usage(conn, NETWORK.network_id)
    assert usage.free == usage.total


async def test_the_default_security_group_is_the_only_one(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    taken = await post(client, security_groups=[{"name": "default"}, {"name": "default"}])
    assert taken.status_code == 202, taken.text
    shown = await show(client, taken.json()["server"]["id"])
    assert shown["security_groups"] == [{"name": "default"}]
    before = await count_instances(db_pool)
    for groups, message in (
        ([{"name": "web"}], "Security group web not found."),
        ([{"name": "default"}, {"name": "db"}], "Security group db not found."),
    ):
        refused = await post(client, security_groups=groups)
        assert refused.status_code == 400, refused.text
        assert refused.json()["badRequest"]["message"] == message
    malformed: object
    for malformed in ("default", [{"id": "x"}], [{"name": ""}], [{}]):
        assert (await post(client, security_groups=malformed)).status_code == 400
    assert await count_instances(db_pool) == before


async def test_access_addresses_are_stored_shown_changed_and_validated(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    created = await post(client, accessIPv4="1.1.1.1", accessIPv6="2001:DB8::0001")
    assert created.status_code == 202, created.text
    server_id = created.json()["server"]["id"]
    server = await show(client, server_id)
    assert (server["accessIPv4"], server["accessIPv6"]) == ("1.1.1.1", "2001:db8::1")
    listed = await client.get("/v2.1/servers/detail", headers=at("2.73", MEMBER))
    assert listed.json()["servers"][0]["accessIPv4"] == "1.1.1.1"

    url = f"/v2.1/servers/{server_id}"
    changed = await client.put(url, headers=MEMBER, json={"server": {"accessIPv4": "4.3.2.1"}})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["server"]["accessIPv4"], changed.json()["server"]["accessIPv6"]) == (
        "4.3.2.1",
        "2001:db8::1",
    )
    assert (await show(client, server_id))["accessIPv4"] == "4.3.2.1"

    plain = await post(client)
    assert (await show(client, plain.json()["server"]["id"]))["accessIPv4"] == ""
    before = await count_instances(db_pool)
    for bad in (
        {"accessIPv4": "1.1.1"},
        {"accessIPv4": "2001:db8::1"},
        {"accessIPv4": ""},
        {"accessIPv4": None},
        {"accessIPv6": "1.1.1.1"},
        {"accessIPv6": "not an address"},
        {"accessIPv6": 7},
    ):
        refused = await post(client, **bad)
        assert refused.status_code == 400, (bad, refused.text)
        assert "access" in refused.json()["badRequest"]["message"]
    assert await count_instances(db_pool) == before


async def test_a_config_drive_asked_for_is_kept_shown_and_a_bad_value_is_400(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)

    with_drive = await post(client, config_drive=True)
    spelled = await post(client, name="web-2", config_drive="true")
    without = await post(client, name="web-3")
    bad = await post(client, name="web-4", config_drive="maybe")

    assert with_drive.status_code == spelled.status_code == without.status_code == 202
    assert (await show(client, with_drive.json()["server"]["id"]))["config_drive"] == "True"
    assert (await show(client, spelled.json()["server"]["id"]))["config_drive"] == "True"
    assert (await show(client, without.json()["server"]["id"]))["config_drive"] == ""
    assert bad.status_code == 400
    assert "config_drive" in bad.text
