"""The Networking API's configured network: keel's pool as a shared external network, addresses
as ports."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest

from shared.config import NetworkSettings
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_image,
)
from tests.functional.services.api.identity_fixtures import add_person
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional

NETWORK = NetworkSettings(cidr="10.0.0.0/24")
BASE = "/network/v2.0"


async def get(
    client: httpx.AsyncClient,
    path: str,
    headers: dict[str, str] = MEMBER,
    params: dict[str, str] | None = None,
    **more: str,
) -> Any:
    response = await client.get(
        f"{BASE}/{path}", headers=headers, params={**(params or {}), **more}
    )
    assert response.status_code == 200, response.text
    return response.json()


async def test_the_pool_is_one_shared_external_network_with_its_subnet(
    client: httpx.AsyncClient,
) -> None:
    versions = await client.get("/network/")
    assert versions.json()["versions"][0]["links"][0]["href"] == "http://keel.test/network/v2.0/"
    [network] = (await get(client, "networks"))["networks"]
    assert network["id"] == str(NETWORK.network_id)
    assert (network["name"], network["router:external"], network["shared"]) == (
        "private",
        True,
        True,
    )
    assert "provider:network_type" not in network
    [subnet] = (await get(client, "subnets"))["subnets"]
    assert network["subnets"] == [subnet["id"]]
    assert (subnet["cidr"], subnet["gateway_ip"]) == ("10.0.0.0/24", "10.0.0.1")
    assert subnet["allocation_pools"] == [{"start": "10.0.0.2", "end": "10.0.0.254"}]
    shown = await get(client, f"networks/{network['id']}", ADMIN)
    assert shown["network"]["provider:network_type"] == "flat"
    assert (await get(client, f"subnets/{subnet['id']}"))["subnet"] == subnet

    external = await get(client, "networks", params={"router:external": "True"})
    assert len(external["networks"]) == 1
    assert (await get(client, "networks", name="public"))["networks"] == []
    only_ids = await get(client, "networks", fields="id")
    assert only_ids == {"networks": [{"id": network["id"]}]}
    assert (await get(client, "floatingips")) == {"floatingips": []}
    aliases = [e["alias"] for e in (await get(client, "extensions"))["extensions"]]
    assert "external-net" in aliases


async def test_each_servers_address_is_a_port_its_project_sees(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server_id = await create(client)
    shown = (await client.get(f"/v2.1/servers/{server_id}", headers=MEMBER)).json()["server"]
    [address] = shown["addresses"]["private"]

    [port] = (await get(client, "ports", device_id=server_id))["ports"]
    assert port["fixed_ips"][0]["ip_address"] == address["addr"]
    assert port["mac_address"] == address["OS-EXT-IPS-MAC:mac_addr"]
    assert (port["network_id"], port["device_owner"], port["status"]) == (
        str(NETWORK.network_id),
        "compute:nova",
        "ACTIVE",
    )
    assert port["project_id"] == "team"
    by_ip = await get(client, "ports", fixed_ips=f"ip_address={address['addr']}")
    assert [p["id"] for p in by_ip["ports"]] == [port["id"]]
    assert (await get(client, f"ports/{port['id']}"))["port"] == port
    assert (await get(client, "ports", OTHER_MEMBER))["ports"] == []
    assert len((await get(client, "ports", ADMIN))["ports"]) == 1

    missing = await client.get(f"{BASE}/ports/{NETWORK.network_id}", headers=MEMBER)
    assert missing.status_code == 404
    assert missing.json()["NeutronError"]["type"] == "PortNotFound"


async def test_bad_requests_are_refused(client: httpx.AsyncClient) -> None:
    unknown = await client.get(f"{BASE}/networks", headers=MEMBER, params={"colour": "red"})
    assert unknown.status_code == 400
    assert "colour" in unknown.json()["NeutronError"]["message"]
    assert (await client.get(f"{BASE}/networks")).status_code == 401
    refused = await client.post(f"{BASE}/networks", headers=ADMIN, json={"network": []})
    assert refused.status_code == 400
    assert refused.json()["NeutronError"]["type"] == "HTTPBadRequest"
    floating = await client.post(f"{BASE}/floatingips", headers=ADMIN, json={})
    assert floating.status_code == 405


async def test_quotas_are_shown_and_cannot_be_changed(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    """`openstack quota show/delete` ask the Networking API too once it is in the catalog."""
    await add_image(db_pool)
    await create(client)

    quota = (await get(client, "quotas/team"))["quota"]
    assert (quota["network"], quota["port"], quota["floatingip"]) == (-1, -1, 0)
    assert (await get(client, "quotas/team.json"))["quota"] == quota
    made = await client.post(f"{BASE}/networks", headers=MEMBER, json={"network": {"name": "n"}})
    assert made.status_code == 201
    details = (await get(client, "quotas/team/details.json"))["quota"]
    assert details["port"] == {"limit": -1, "used": 1, "reserved": 0}
    assert details["network"]["used"] == 1
    assert details["security_group"]["used"] == 1
    assert (await get(client, "quotas/elsewhere/details", OTHER_MEMBER))["quota"]["port"][
        "used"
    ] == 0

    others = await client.get(f"{BASE}/quotas/team", headers=OTHER_MEMBER)
    assert others.status_code == 403
    assert others.json()["NeutronError"]["type"] == "HTTPForbidden"
    assert (await client.delete(f"{BASE}/quotas/team", headers=MEMBER)).status_code == 403
    assert (await client.delete(f"{BASE}/quotas/team", headers=ADMIN)).status_code == 204
    changed = await client.put(f"{BASE}/quotas/team", headers=ADMIN, json={"quota": {"network": 5}})
    assert changed.status_code == 400
    assert (await get(client, "quotas/team", ADMIN))["quota"] == quota


async def test_an_admin_may_delete_a_default_group_and_it_stays(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    """As Tempest's dynamic credentials clean a project up before deleting it."""
    person = await add_person(db_pool, "alice", "web")
    listed = await get(client, "security-groups", ADMIN, project_id=person.project_id)
    [group] = [g for g in listed["security_groups"] if g["project_id"] == person.project_id]
    path = f"{BASE}/security-groups/{group['id']}"
    refused = await client.delete(path, headers=MEMBER)
    assert refused.status_code == 404  # another project's group: the member does not see it
    own = (await get(client, "security-groups"))["security_groups"][0]["id"]
    kept = await client.delete(f"{BASE}/security-groups/{own}", headers=MEMBER)
    assert kept.status_code == 409
    assert kept.json()["NeutronError"]["type"] == "SecurityGroupCannotRemoveDefault"
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    again = await get(client, "security-groups", ADMIN, project_id=person.project_id)
    assert group in again["security_groups"]
    unknown = await client.delete(f"{BASE}/security-groups/nope", headers=ADMIN)
    assert unknown.status_code == 404
