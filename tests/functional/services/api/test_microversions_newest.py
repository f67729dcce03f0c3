"""Microversions 2.102 and 2.104 in detail: closed query strings, flavors, zone pins.

2.102 refuses a query parameter on every route that takes none, drops ``rxtx_factor``
and ``OS-FLV-DISABLED:disabled`` from flavors and filters the flavor lists by ``name``;
2.104 lets an update unpin a server's zone or pin it to the one it is in.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import request_specs
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional


@pytest.fixture
async def server_id(client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder) -> str:
    """A member's server, created asking for zone ``east`` and placed on a node there."""
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "east-1", zone="east")
    await add_compute(db_pool, "west-1", zone="west")
    body = server_body("pinned", availability_zone="east", tags=["t"], metadata={"k": "v"})
    made = await client.post("/v2.1/servers", headers=at("2.104", MEMBER), json=body)
    assert made.status_code == 202, made.text
    created: str = made.json()["server"]["id"]
    await place_on(db_pool, created, node)
    return created


#: Routes that take no query parameter (``{id}`` is the server's), and whose token.
CLOSED = [
    ("servers/{id}", MEMBER),
    ("servers/{id}/ips", MEMBER),
    ("servers/{id}/ips/private", MEMBER),
    ("servers/{id}/metadata", MEMBER),
    ("servers/{id}/metadata/k", MEMBER),
    ("servers/{id}/tags", MEMBER),
    ("servers/{id}/os-security-groups", MEMBER),
    ("servers/{id}/os-server-password", MEMBER),
    ("servers/{id}/topology", MEMBER),
    ("servers/{id}/migrations", ADMIN),
    ("flavors/1", MEMBER),
    ("flavors/1/os-extra_specs", MEMBER),
    ("os-availability-zone", MEMBER),
    ("os-availability-zone/detail", ADMIN),
    ("os-aggregates", ADMIN),
    ("os-quota-sets/team/defaults", MEMBER),
]


@pytest.mark.parametrize(("path", "headers"), CLOSED, ids=[path for path, _ in CLOSED])
async def test_a_route_that_takes_no_query_parameter_refuses_one_from_2_102(
    client: httpx.AsyncClient, server_id: str, path: str, headers: dict[str, str]
) -> None:
    url = "/v2.1/" + path.format(id=server_id)
    assert (await client.get(url, headers=at("2.102", headers))).status_code == 200
    assert (await client.get(f"{url}?bogus=1", headers=at("2.101", headers))).status_code == 200
    refused = await client.get(f"{url}?bogus=1", headers=at("2.102", headers))
    assert refused.status_code == 400, refused.text
    expected = "Additional properties are not allowed ('bogus' was unexpected)"
    assert refused.json()["badRequest"]["message"] == expected


async def test_an_action_and_the_ips_of_a_network_refuse_it_too(
    client: httpx.AsyncClient, server_id: str
) -> None:
    base = f"/v2.1/servers/{server_id}/os-instance-actions"
    [create] = (await client.get(base, headers=at("2.102", MEMBER))).json()["instanceActions"]
    action = f"{base}/{create['request_id']}?bogus=1"
    assert (await client.get(action, headers=at("2.101", MEMBER))).status_code == 200
    assert (await client.get(action, headers=at("2.102", MEMBER))).status_code == 400


async def test_flavors_lose_rxtx_and_disabled_and_filter_by_name_from_2_102(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    detail = (await client.get("/v2.1/flavors/detail", headers=at("2.102"))).json()["flavors"]
    assert detail
    assert all("rxtx_factor" not in f and "OS-FLV-DISABLED:disabled" not in f for f in detail)
    older = (await client.get("/v2.1/flavors/1", headers=at("2.101"))).json()["flavor"]
    assert older["rxtx_factor"] == 1.0
    assert older["OS-FLV-DISABLED:disabled"] is False

    names = sorted(f["name"] for f in detail)
    wanted = names[0]
    named = await client.get(f"/v2.1/flavors?name=^{wanted}$", headers=at("2.102"))
    assert [f["name"] for f in named.json()["flavors"]] == [wanted]
    ignored = await client.get(f"/v2.1/flavors?name=^{wanted}$", headers=at("2.101"))
    assert ignored.status_code == 400  # an unknown parameter from 2.75 until 2.102
    bad = await client.get("/v2.1/flavors?name=(", headers=at("2.102"))
    assert bad.status_code == 400

    by_ram = await client.get(
        "/v2.1/flavors/detail?sort_key=memory_mb&sort_dir=desc", headers=at("2.102")
    )
    rams = [f["ram"] for f in by_ram.json()["flavors"]]
    assert rams == sorted(rams, reverse=True)
    rxtx = "/v2.1/flavors?sort_key=rxtx_factor"
    assert (await client.get(rxtx, headers=at("2.101"))).status_code == 200
    assert (await client.get(rxtx, headers=at("2.102"))).status_code == 400
    assert (await client.get("/v2.1/flavors?sort_key=colour", headers=ADMIN)).status_code == 400
    assert (await client.get("/v2.1/flavors?sort_dir=up", headers=ADMIN)).status_code == 400

    flavor = {"name": "rx", "ram": 64, "vcpus": 1, "disk": 0, "rxtx_factor": 2.0}
    made = await client.post("/v2.1/flavors", headers=at("2.102"), json={"flavor": flavor})
    assert made.status_code == 400
    assert "'rxtx_factor' was unexpected" in made.json()["badRequest"]["message"]
    older_made = await client.post(
        "/v2.1/flavors", headers=at("2.101"), json={"flavor": {**flavor, "name": "rx-old"}}
    )
    assert older_made.status_code == 200, older_made.text


async def pin(client: httpx.AsyncClient, server_id: str, zone: str | None) -> httpx.Response:
    return await client.put(
        f"/v2.1/servers/{server_id}",
        headers=at("2.104", MEMBER),
        json={"server": {"pinned_availability_zone": zone}},
    )


async def pinned(pool: asyncpg.Pool, server_id: str) -> str | None:
    async with pool.acquire() as conn:
        return (await request_specs.asked(conn, [UUID(server_id)]))[UUID(server_id)].zone


async def test_a_server_is_unpinned_and_pinned_again_only_to_its_own_zone(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server_id: str
) -> None:
    same = await pin(client, server_id, "east")
    assert same.status_code == 200, same.text
    assert same.json()["server"]["pinned_availability_zone"] == "east"

    changed = await pin(client, server_id, "west")
    assert changed.status_code == 409
    assert "Unpin first" in changed.json()["conflictingRequest"]["message"]
    assert await pinned(db_pool, server_id) == "east"

    unpinned = await pin(client, server_id, None)
    assert unpinned.status_code == 200
    assert unpinned.json()["server"]["pinned_availability_zone"] is None
    assert await pinned(db_pool, server_id) is None
    assert (await pin(client, server_id, None)).status_code == 200

    elsewhere = await pin(client, server_id, "west")
    assert elsewhere.status_code == 409
    message = elsewhere.json()["conflictingRequest"]["message"]
    assert message == (
        "Server can only be pinned to its current availability zone 'east', but 'west' "
        "was requested."
    )
    repinned = await pin(client, server_id, "east")
    assert repinned.status_code == 200
    assert await pinned(db_pool, server_id) == "east"


@pytest.mark.parametrize("zone", ["", " east", 5])
async def test_a_pin_that_is_no_zone_name_is_400(
    client: httpx.AsyncClient, server_id: str, zone: Any
) -> None:
    assert (await pin(client, server_id, zone)).status_code == 400


async def test_two_unpins_and_pins_at_once_leave_a_pin_nova_would_have(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server_id: str
) -> None:
    answers = await asyncio.gather(pin(client, server_id, None), pin(client, server_id, None))
    assert [a.status_code for a in answers] == [200, 200]
    assert await pinned(db_pool, server_id) is None
    answers = await asyncio.gather(pin(client, server_id, "east"), pin(client, server_id, "east"))
    assert [a.status_code for a in answers] == [200, 200]
    assert await pinned(db_pool, server_id) == "east"
