"""Project networks and security groups with the real processes and the stock
``openstack`` CLI: ``network create``, ``subnet create``, ``server create --nic
net-id=A --nic net-id=B``, ``server add/remove security group``; the guest built with
every address, which a cold migration keeps; and the network freed by the delete.

Two hosts with the local driver.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from tests.e2e.cloud import Cloud, CloudConfig
from tests.e2e.moves import guest, migrate, shown, until_server

#: Each CLI command starts a Python process: on two busy shared cores the first test
#: alone has taken more than five minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=("net-1", "net-2"))


def network(cloud: Cloud, name: str, cidr: str) -> tuple[str, str]:
    """A new network with its subnet; their ids."""
    made: dict[str, Any] = cloud.openstack("network", "create", name)
    subnet: dict[str, Any] = cloud.openstack(
        "subnet", "create", "--network", made["id"], "--subnet-range", cidr, f"{name}-subnet"
    )
    assert subnet["cidr"] == cidr
    return made["id"], subnet["id"]


def addresses_of(server: dict[str, Any]) -> dict[str, list[str]]:
    """``addresses`` as the CLI shows it (a mapping, or ``net=a, b; net2=c`` text)."""
    raw = server["addresses"]
    if isinstance(raw, dict):
        return {
            name: list(found) if isinstance(found, list) else [found] for name, found in raw.items()
        }
    shown: dict[str, list[str]] = {}
    for part in str(raw).split(";"):
        name, _, found = part.strip().partition("=")
        shown[name] = [a.strip() for a in found.split(",")]
    return shown


async def test_a_server_on_two_networks_with_a_security_group(cloud: Cloud) -> None:
    net_a, _ = network(cloud, "net-a", "10.110.0.0/24")
    net_b, subnet_b = network(cloud, "net-b", "10.111.0.0/24")
    cloud.openstack("security", "group", "create", "web")

    server: dict[str, Any] = cloud.openstack(
        "server",
        "create",
        "--flavor",
        "m1.tiny",
        "--image",
        "cirros",
        "--nic",
        f"net-id={net_a}",
        "--nic",
        f"net-id={net_b}",
        "--wait",
        "multi",
    )
    sid = server["id"]
    held = addresses_of(server)
    assert list(held) == ["net-a", "net-b"]
    assert ipaddress.IPv4Address(held["net-a"][0]) in ipaddress.IPv4Network("10.110.0.0/24")
    assert ipaddress.IPv4Address(held["net-b"][0]) in ipaddress.IPv4Network("10.111.0.0/24")

    # The agent built the guest with both addresses, in the order asked for.
    first = await shown(cloud, sid)
    host = first["OS-EXT-SRV-ATTR:host"]
    spec = json.loads((guest(cloud, host, sid) / "metadata.json").read_text())
    assert [a["address"] for a in spec["addresses"]] == [held["net-a"][0], held["net-b"][0]]

    cloud.openstack("server", "add", "security", "group", sid, "web", as_json=False)
    groups = {g["name"] for g in (await shown(cloud, sid))["security_groups"]}
    assert groups == {"default", "web"}
    in_use = cloud.openstack_raw("security", "group", "delete", "web", as_json=False)
    assert in_use.returncode != 0
    cloud.openstack("server", "remove", "security", "group", sid, "default", as_json=False)
    assert [g["name"] for g in (await shown(cloud, sid))["security_groups"]] == ["web"]

    # A cold migration keeps every address.
    migrate(cloud, sid)
    await until_server(cloud, sid, "VERIFY_RESIZE")
    async with cloud.http(cloud.admin_token) as http:
        confirmed = await http.post(f"servers/{sid}/action", json={"confirmResize": None})
    assert confirmed.status_code == 204, confirmed.text
    moved = await until_server(cloud, sid, "ACTIVE")
    assert moved["OS-EXT-SRV-ATTR:host"] != host
    assert {name: [a["addr"] for a in found] for name, found in moved["addresses"].items()} == held
    moved_spec = json.loads(
        (guest(cloud, moved["OS-EXT-SRV-ATTR:host"], sid) / "metadata.json").read_text()
    )
    assert [a["address"] for a in moved_spec["addresses"]] == [held["net-a"][0], held["net-b"][0]]

    refused = cloud.openstack_raw("network", "delete", net_b, as_json=False)
    assert refused.returncode != 0
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
    cloud.openstack("subnet", "delete", subnet_b, as_json=False)
    cloud.openstack("network", "delete", net_a, net_b, as_json=False)
    cloud.openstack("security", "group", "delete", "web", as_json=False)
    names = [n["Name"] for n in cloud.openstack("network", "list")]
    assert names == ["private"]


def test_a_network_that_does_not_exist_is_refused(cloud: Cloud) -> None:
    refused = cloud.openstack_raw(
        "server",
        "create",
        "--flavor",
        "m1.tiny",
        "--image",
        "cirros",
        "--nic",
        "net-id=0c0ffee0-0000-4000-8000-000000000000",
        "lost",
        as_json=False,
    )
    assert refused.returncode != 0
    # The CLI looks the network up first (Neutron's 404); the compute API says the same.
    assert "No Network found" in refused.stderr or "could not be found" in refused.stderr
    assert cloud.openstack("server", "list") == []
