"""What users do every day with servers, through the real openstack CLI and openstacksdk."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import openstack
import pytest
from openstack.config.loader import OpenStackConfig

from tests.e2e.cloud import Cloud

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
]


def sdk(cloud: Cloud, name: str = "keel") -> openstack.connection.Connection:
    region = OpenStackConfig(config_files=[str(cloud.clouds_yaml)]).get_one(cloud=name)
    return openstack.connection.Connection(config=region)


def sdk_create_and_delete(cloud: Cloud) -> tuple[Any, Any]:
    conn = sdk(cloud)
    server = conn.create_server("sdk-1", image="cirros", flavor="m1.tiny", wait=True, timeout=60)
    shown = conn.get_server(server.id)
    assert conn.delete_server(server.id, wait=True, timeout=60)
    return server, shown


async def test_the_sdk_cloud_layer_creates_a_server_with_an_address_and_deletes_it(
    cloud: Cloud,
) -> None:
    server, shown = await asyncio.to_thread(sdk_create_and_delete, cloud)
    assert server.status == "ACTIVE"
    [address] = server.addresses["private"]
    assert address["addr"].startswith("10.0.")
    assert address["OS-EXT-IPS:type"] == "fixed"
    # Found through the Networking API: the pool is external, so the address is public.
    assert server.public_v4 == address["addr"]
    assert shown.id == server.id
    assert cloud.openstack("server", "list") == []


def test_properties_name_and_description_through_the_cli(cloud: Cloud) -> None:
    server = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait",
        "--property", "role=web", "--property", "tier=front", "cli-1",
    )  # fmt: skip
    assert server["status"] == "ACTIVE"
    assert server["properties"] == {"role": "web", "tier": "front"}
    assert list(server["addresses"]) == ["private"]
    assert server["OS-EXT-AZ:availability_zone"] == "nova"
    assert server["adminPass"]

    cloud.openstack("server", "set", "--property", "owner=ops", server["id"], as_json=False)
    cloud.openstack("server", "unset", "--property", "tier", server["id"], as_json=False)
    cloud.openstack("server", "set", "--name", "cli-renamed", server["id"], as_json=False)
    cloud.openstack(
        "--os-compute-api-version", "2.19", "server", "set", "--description", "the front end",
        server["id"], as_json=False,
    )  # fmt: skip

    shown = cloud.openstack("--os-compute-api-version", "2.19", "server", "show", server["id"])
    assert shown["name"] == "cli-renamed"
    assert shown["properties"] == {"role": "web", "owner": "ops"}
    assert shown["description"] == "the front end"
    cloud.openstack("server", "delete", "--wait", server["id"], as_json=False)


def test_server_list_filters_through_the_cli(cloud: Cloud) -> None:
    server = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "listed"
    )
    since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")

    def ids(*options: str) -> list[str]:
        return [s["ID"] for s in cloud.openstack("server", "list", *options)]

    assert ids("--flavor", "m1.tiny") == [server["id"]]
    assert ids("--flavor", "m1.small") == []
    assert ids("--availability-zone", "nova") == [server["id"]]
    assert ids("--availability-zone", "elsewhere") == []
    assert ids("--changes-since", since) == [server["id"]]
    assert ids("--changes-since", later) == []
    assert ids("--image", "cirros") == [server["id"]]
    [address] = server["addresses"]["private"]
    assert ids("--ip", address) == [server["id"]]
    cloud.openstack("server", "delete", "--wait", server["id"], as_json=False)
    deleted = ids("--deleted")
    assert server["id"] in deleted
    assert not set(deleted) & set(ids())


def test_zones_statistics_and_old_service_routes_through_the_cli(cloud: Cloud) -> None:
    zones = cloud.openstack("availability", "zone", "list", "--compute")
    assert {(z["Zone Name"], z["Zone Status"]) for z in zones} >= {("nova", "available")}
    stats = cloud.openstack("hypervisor", "stats", "show")
    assert stats["count"] == len(cloud.config.computes)
    host = cloud.config.computes[0]
    cloud.openstack(
        "--os-compute-api-version", "2.52", "compute", "service", "set", "--disable",
        "--disable-reason", "maintenance", host, "keel-compute", as_json=False,
    )  # fmt: skip
    listed = cloud.openstack("compute", "service", "list", "--long", "--host", host)
    # The reason as the operator gave it, then whether the host's fence is armed.
    assert [(s["Status"], s["Disabled Reason"]) for s in listed] == [
        ("disabled", "maintenance; fence armed, lease 10s")
    ]
    cloud.openstack(
        "--os-compute-api-version", "2.52", "compute", "service", "set", "--enable", host,
        "keel-compute", as_json=False,
    )  # fmt: skip
    listed = cloud.openstack("compute", "service", "list", "--host", host)
    assert [s["Status"] for s in listed] == ["enabled"]
