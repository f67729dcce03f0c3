"""Networks and subnets projects create, and servers on several of them, over real
PostgreSQL: the Networking API's shapes and refusals, addresses in request order, the
409s of deleting what a server uses, and races for the last address."""

from __future__ import annotations

import asyncio
import ipaddress
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
from tests.functional.services.api.test_network_api import NETWORK
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

BASE = "/network/v2.0"


async def new_network(
    client: httpx.AsyncClient, name: str, cidr: str | None, headers: dict[str, str] = MEMBER
) -> dict[str, Any]:
    made = await client.post(f"{BASE}/networks", headers=headers, json={"network": {"name": name}})
    assert made.status_code == 201, made.text
    network: dict[str, Any] = made.json()["network"]
    if cidr is not None:
        subnet = await client.post(
            f"{BASE}/subnets",
            headers=headers,
            json={"subnet": {"network_id": network["id"], "cidr": cidr, "ip_version": 4}},
        )
        assert subnet.status_code == 201, subnet.text
        network["subnet"] = subnet.json()["subnet"]
    return network


async def boot(
    client: httpx.AsyncClient, networks: Any, headers: dict[str, str] = MEMBER, **extra: object
) -> httpx.Response:
    body = server_body("multi", **extra)
    body["server"]["networks"] = networks  # type: ignore[index]
    return await client.post("/v2.1/servers", headers=at("2.73", headers), json=body)


def neutron_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    kind: str = response.json()["NeutronError"]["type"]
    return kind


async def test_a_project_creates_a_network_and_its_subnet_and_sees_them(
    client: httpx.AsyncClient,
) -> None:
    network = await new_network(client, "blue", "10.20.0.0/24")
    subnet = network["subnet"]
    assert (network["name"], network["shared"], network["router:external"]) == (
        "blue",
        False,
        False,
    )
    assert network["project_id"] == "team"
    assert (subnet["cidr"], subnet["gateway_ip"], subnet["network_id"]) == (
        "10.20.0.0/24",
        "10.20.0.1",
        network["id"],
    )
    assert subnet["allocation_pools"] == [{"start": "10.20.0.2", "end": "10.20.0.254"}]
    shown = (await client.get(f"{BASE}/networks/{network['id']}", headers=MEMBER)).json()
    assert shown["network"]["subnets"] == [subnet["id"]]
    names = [
        n["name"] for n in (await client.get(f"{BASE}/networks", headers=MEMBER)).json()["networks"]
    ]
    assert names == ["private", "blue"]
    listed = await client.get(
        f"{BASE}/subnets", headers=MEMBER, params={"network_id": network["id"]}
    )
    assert [s["id"] for s in listed.json()["subnets"]] == [subnet["id"]]
    # Another project sees neither; an admin sees both.
    others = (await client.get(f"{BASE}/networks", headers=OTHER_MEMBER)).json()["networks"]
    assert [n["name"] for n in others] == ["private"]
    hidden = await client.get(f"{BASE}/networks/{network['id']}", headers=OTHER_MEMBER)
    assert neutron_error(hidden, 404) == "NetworkNotFound"
    admin = (await client.get(f"{BASE}/networks", headers=ADMIN)).json()["networks"]
    assert network["id"] in {n["id"] for n in admin}

    renamed = await asyncio.gather(
        *(
            client.put(
                f"{BASE}/networks/{network['id']}",
                headers=MEMBER,
                json={"network": {"name": "navy"}},
            )
            for _ in range(2)
        )
    )
    assert [r.status_code for r in renamed] == [200, 200]
    assert renamed[0].json()["network"]["name"] == "navy"
    sub_path = f"{BASE}/subnets/{subnet['id']}"
    named = await client.put(sub_path, headers=MEMBER, json={"subnet": {"name": "navy-v4"}})
    assert named.json()["subnet"]["name"] == "navy-v4"
    moved = await client.put(sub_path, headers=MEMBER, json={"subnet": {"cidr": "10.9.0.0/24"}})
    assert neutron_error(moved, 400) == "HTTPBadRequest"
    theirs = await client.put(sub_path, headers=OTHER_MEMBER, json={"subnet": {"name": "x"}})
    assert neutron_error(theirs, 404) == "SubnetNotFound"

    assert (
        await client.delete(f"{BASE}/subnets/{subnet['id']}", headers=MEMBER)
    ).status_code == 204
    gone = await client.get(f"{BASE}/subnets/{subnet['id']}", headers=MEMBER)
    assert neutron_error(gone, 404) == "SubnetNotFound"
    assert (
        await client.delete(f"{BASE}/networks/{network['id']}", headers=MEMBER)
    ).status_code == 204
    again = await client.delete(f"{BASE}/networks/{network['id']}", headers=MEMBER)
    assert neutron_error(again, 404) == "NetworkNotFound"


@pytest.mark.parametrize(
    ("subnet", "words"),
    [
        ({"cidr": "10.1.0.1/24"}, "'10.1.0.0/24' is recommended"),
        ({"cidr": "fd00::/64", "ip_version": 6}, "IPv4 only"),
        ({"cidr": "10.0.0.0/8"}, "/16 to /30"),
        ({"cidr": "banana"}, "not a valid IPv4 subnet"),
        ({}, "needs its cidr"),
        ({"cidr": "10.1.0.0/24", "gateway_ip": "10.9.9.9"}, "not a host address"),
        ({"cidr": "10.1.0.0/24", "colour": "red"}, "Unrecognized attribute(s) 'colour'"),
        ({"cidr": "10.1.0.0/24", "dns_nameservers": ["1.1.1.1"]}, "no dns_nameservers"),
        (
            {"cidr": "10.1.0.0/24", "allocation_pools": [{"start": "10.1.0.1", "end": "10.1.0.9"}]},
            "conflicts with allocation pool",
        ),
    ],
)
async def test_subnets_keel_cannot_make_are_400s_that_say_why(
    client: httpx.AsyncClient, subnet: dict[str, Any], words: str
) -> None:
    network = await new_network(client, "red", None)
    refused = await client.post(
        f"{BASE}/subnets", headers=MEMBER, json={"subnet": {"network_id": network["id"], **subnet}}
    )
    assert neutron_error(refused, 400) == "HTTPBadRequest"
    assert words in refused.json()["NeutronError"]["message"]


async def test_networks_that_cannot_be_touched_are_refused(client: httpx.AsyncClient) -> None:
    network = await new_network(client, "green", "10.30.0.0/29")
    second = await client.post(
        f"{BASE}/subnets",
        headers=MEMBER,
        json={"subnet": {"network_id": network["id"], "cidr": "10.31.0.0/29"}},
    )
    assert "one IPv4 subnet" in second.json()["NeutronError"]["message"]
    others = await client.post(
        f"{BASE}/subnets",
        headers=OTHER_MEMBER,
        json={"subnet": {"network_id": network["id"], "cidr": "10.31.0.0/29"}},
    )
    assert neutron_error(others, 404) == "NetworkNotFound"
    configured = await client.delete(f"{BASE}/networks/{NETWORK.network_id}", headers=ADMIN)
    assert neutron_error(configured, 403) == "HTTPForbidden"
    shared = await client.post(
        f"{BASE}/networks", headers=MEMBER, json={"network": {"name": "x", "shared": True}}
    )
    assert neutron_error(shared, 400) == "HTTPBadRequest"
    not_json = await client.post(f"{BASE}/networks", headers=MEMBER, content=b"{")
    assert neutron_error(not_json, 400) == "HTTPBadRequest"
    foreign = await client.post(
        f"{BASE}/networks", headers=MEMBER, json={"network": {"project_id": "elsewhere"}}
    )
    assert neutron_error(foreign, 403) == "HTTPForbidden"


async def test_a_server_gets_one_address_per_requested_network_in_order(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    net1 = await new_network(client, "zeta", "10.40.0.0/24")
    net2 = await new_network(client, "alpha", "10.41.0.0/24")
    asked = [{"uuid": net1["id"]}, {"uuid": net2["id"]}, {"uuid": net1["id"]}]
    made = await boot(client, asked)
    assert made.status_code == 202, made.text
    server_id = made.json()["server"]["id"]

    addresses = (await client.get(f"/v2.1/servers/{server_id}/ips", headers=MEMBER)).json()[
        "addresses"
    ]
    assert list(addresses) == ["zeta", "alpha"]
    zeta = [a["addr"] for a in addresses["zeta"]]
    assert len(set(zeta)) == 2
    assert all(ipaddress.IPv4Address(a) in ipaddress.IPv4Network("10.40.0.0/24") for a in zeta)
    assert ipaddress.IPv4Address(addresses["alpha"][0]["addr"]) in ipaddress.IPv4Network(
        "10.41.0.0/24"
    )
    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    assert list(shown["addresses"]) == ["zeta", "alpha"]
    ports = await client.get(f"{BASE}/ports", headers=MEMBER, params={"device_id": server_id})
    assert {p["fixed_ips"][0]["subnet_id"] for p in ports.json()["ports"]} == {
        net1["subnet"]["id"],
        net2["subnet"]["id"],
    }

    in_use = await client.delete(f"{BASE}/networks/{net1['id']}", headers=MEMBER)
    assert neutron_error(in_use, 409) == "NetworkInUse"
    subnet_in_use = await client.delete(f"{BASE}/subnets/{net2['subnet']['id']}", headers=MEMBER)
    assert neutron_error(subnet_in_use, 409) == "SubnetInUse"

    assert (await client.delete(f"/v2.1/servers/{server_id}", headers=MEMBER)).status_code == 204
    assert (await client.delete(f"{BASE}/networks/{net1['id']}", headers=MEMBER)).status_code == 204
    assert (await client.delete(f"{BASE}/networks/{net2['id']}", headers=MEMBER)).status_code == 204


async def test_networks_a_server_cannot_be_on_are_400s(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    bare = await new_network(client, "bare", None)
    theirs = await new_network(client, "theirs", "10.50.0.0/29", headers=OTHER_MEMBER)
    missing = "0c0ffee0-0000-4000-8000-000000000000"
    for networks, words in [
        ([{"uuid": missing}], f"Network {missing} could not be found."),
        ([{"uuid": theirs["id"]}], f"Network {theirs['id']} could not be found."),
        ([{"uuid": bare["id"]}], "requires a subnet"),
        ([{"uuid": theirs["id"], "fixed_ip": "10.50.0.2"}], "could not be found"),
    ]:
        refused = await boot(client, networks)
        assert refused.status_code == 400, refused.text
        assert words in refused.json()["badRequest"]["message"]
    async with db_pool.acquire() as conn:
        held = await conn.fetchval("SELECT count(*) FROM fixed_ips WHERE instance_uuid IS NOT NULL")
        servers = await conn.fetchval("SELECT count(*) FROM instances")
    assert (held, servers) == (0, 0)


async def test_a_fixed_ip_on_a_project_network_is_honoured_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    net = await new_network(client, "fixed", "10.60.0.0/28")
    first = await boot(client, [{"uuid": net["id"], "fixed_ip": "10.60.0.9"}])
    assert first.status_code == 202, first.text
    ips = await client.get(f"/v2.1/servers/{first.json()['server']['id']}/ips", headers=MEMBER)
    assert ips.json()["addresses"]["fixed"][0]["addr"] == "10.60.0.9"
    taken = await boot(client, [{"uuid": net["id"], "fixed_ip": "10.60.0.9"}])
    assert taken.status_code == 400
    assert "already in use" in taken.json()["badRequest"]["message"]
    gateway = await boot(client, [{"uuid": net["id"], "fixed_ip": "10.60.0.1"}])
    assert gateway.status_code == 400
    assert "not available" in gateway.json()["badRequest"]["message"]


async def test_two_creates_racing_for_the_last_address_never_share_it(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    """A /30 keeps one address for servers besides its gateway: of creates at once, one
    gets it, the others are refused and leave nothing behind."""
    await add_image(db_pool)
    net = await new_network(client, "tiny", "10.70.0.0/30")
    answers = await asyncio.gather(*(boot(client, [{"uuid": net["id"]}]) for _ in range(4)))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [202, 409, 409, 409], [a.text for a in answers]
    async with db_pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT host(address) AS a, instance_uuid FROM fixed_ips WHERE network_id = $1::uuid",
            net["id"],
        )
        live = await conn.fetchval("SELECT count(*) FROM instances WHERE deleted_at IS NULL")
    assert [(r["a"], r["instance_uuid"] is not None) for r in rows] == [("10.70.0.2", True)]
    assert live == 1


async def test_creating_or_deleting_twice_at_once_acts_once(client: httpx.AsyncClient) -> None:
    """Each handler run twice concurrently: a second subnet on one network is refused,
    and of two deletes one answers 204 and the other 404."""
    net = await new_network(client, "twice", None)
    body = {"subnet": {"network_id": net["id"], "cidr": "10.80.0.0/24"}}
    made = await asyncio.gather(
        *(client.post(f"{BASE}/subnets", headers=MEMBER, json=body) for _ in range(2))
    )
    assert sorted(m.status_code for m in made) == [201, 400]
    subnet_id = next(m.json()["subnet"]["id"] for m in made if m.status_code == 201)
    dropped = await asyncio.gather(
        *(client.delete(f"{BASE}/subnets/{subnet_id}", headers=MEMBER) for _ in range(2))
    )
    assert sorted(d.status_code for d in dropped) == [204, 404]
    gone = await asyncio.gather(
        *(client.delete(f"{BASE}/networks/{net['id']}", headers=MEMBER) for _ in range(2))
    )
    assert sorted(g.status_code for g in gone) == [204, 404]
    both = await asyncio.gather(
        *(
            client.post(f"{BASE}/networks", headers=MEMBER, json={"network": {"name": "same"}})
            for _ in range(2)
        )
    )
    assert [b.status_code for b in both] == [201, 201]
    assert both[0].json()["network"]["id"] != both[1].json()["network"]["id"]


async def test_a_network_delete_racing_a_create_on_it_never_strands_an_address(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    net = await new_network(client, "racing", "10.90.0.0/29")
    made, dropped = await asyncio.gather(
        boot(client, [{"uuid": net["id"]}]),
        client.delete(f"{BASE}/networks/{net['id']}", headers=MEMBER),
    )
    if dropped.status_code == 204:
        assert made.status_code == 400, made.text
    else:
        assert (made.status_code, dropped.status_code) == (202, 409)
    async with db_pool.acquire() as conn:
        stranded = await conn.fetchval(
            """SELECT count(*) FROM fixed_ips f
                WHERE f.instance_uuid IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM networks n WHERE n.id = f.network_id)"""
        )
    assert stranded == 0
