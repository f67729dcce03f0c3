"""The stock openstack client against a running keel cloud: servers, services, catalogue."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.cloud import ADMIN, CIRROS_ID, Cloud

pytestmark = pytest.mark.e2e

SETTLE_TIMEOUT = 60.0


def wait_for_status(cloud: Cloud, server_id: str, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        server: dict[str, Any] = cloud.openstack("server", "show", server_id)
        if server["status"] in statuses or time.monotonic() > deadline:
            return server
        time.sleep(1)


async def hypervisor_usage(cloud: Cloud) -> dict[str, tuple[int, int, int]]:
    """Usage per hypervisor, read at microversion 2.1 where the API still reports it."""
    async with cloud.http(cloud.admin_token) as http:
        response = await http.get("os-hypervisors/detail")
    assert response.status_code == 200, response.text
    return {
        h["hypervisor_hostname"]: (h["vcpus_used"], h["memory_mb_used"], h["local_gb_used"])
        for h in response.json()["hypervisors"]
    }


def test_server_lifecycle_on_an_agent(cloud: Cloud) -> None:
    server = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "demo"
    )
    assert server["status"] == "ACTIVE"
    host = server["OS-EXT-SRV-ATTR:host"]
    assert host in cloud.config.computes
    instance_dir = cloud.state_dir(host) / "instances" / server["id"]
    assert instance_dir.is_dir()

    listed = cloud.openstack("server", "list")
    assert [(s["ID"], s["Name"], s["Status"]) for s in listed] == [(server["id"], "demo", "ACTIVE")]

    shown = cloud.openstack("server", "show", "demo")
    assert shown["id"] == server["id"]
    assert shown["OS-EXT-SRV-ATTR:host"] == host

    cloud.openstack("server", "delete", "--wait", server["id"], as_json=False)
    assert not instance_dir.exists()
    assert cloud.openstack("server", "list") == []


def test_console_log_shows_each_boot_with_the_stock_client(cloud: Cloud) -> None:
    server = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "talker"
    )
    marker = f"keel-guest-up {server['id']}"

    booted = cloud.openstack("console", "log", "show", "talker", as_json=False)
    cloud.openstack("server", "stop", "talker", as_json=False)
    stopped = wait_for_status(cloud, server["id"], {"SHUTOFF"})
    cloud.openstack("server", "start", "talker", as_json=False)
    started = wait_for_status(cloud, server["id"], {"ACTIVE"})
    last = cloud.openstack("console", "log", "show", "--lines", "3", "talker", as_json=False)
    cloud.openstack("server", "delete", "--wait", server["id"], as_json=False)

    assert booted.count(marker) == 1
    assert (stopped["status"], started["status"]) == ("SHUTOFF", "ACTIVE")
    assert last.count(marker) == 1
    assert "powered off" in last
    assert len(last.rstrip("\n").split("\n")) <= 3


def test_members_see_their_own_servers_without_host_details(cloud: Cloud) -> None:
    member = "keel-member"
    server = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "mine",
        cloud=member,
    )  # fmt: skip
    assert server["status"] == "ACTIVE"
    assert cloud.openstack("server", "show", server["id"], cloud=member).get(
        "OS-EXT-SRV-ATTR:host"
    ) in (None, "")
    assert [s["ID"] for s in cloud.openstack("server", "list", cloud=member)] == [server["id"]]
    assert cloud.openstack("server", "list") == []
    everyone = cloud.openstack("server", "list", "--all-projects")
    assert [s["ID"] for s in everyone] == [server["id"]]
    cloud.openstack("server", "delete", "--wait", server["id"], cloud=member, as_json=False)


def test_services_hypervisors_flavors_and_images_are_listed(cloud: Cloud) -> None:
    services = cloud.openstack("compute", "service", "list")
    seen = sorted((s["Binary"], s["Host"], s["Status"], s["State"]) for s in services)
    assert seen == [
        ("keel-compute", "compute1", "enabled", "up"),
        ("keel-compute", "compute2", "enabled", "up"),
        ("keel-conductor", "controller", "enabled", "up"),
        ("keel-scheduler", "controller", "enabled", "up"),
    ]

    hypervisors = cloud.openstack("hypervisor", "list")
    assert len(hypervisors) == 2
    assert {h["State"] for h in hypervisors} == {"up"}

    flavors = {f["Name"] for f in cloud.openstack("flavor", "list")}
    assert {"m1.tiny", "m1.small", "m1.medium", "m1.large", "m1.xlarge"} <= flavors

    images = cloud.openstack("image", "list")
    assert [(i["ID"], i["Name"]) for i in images] == [(str(CIRROS_ID), "cirros")]


async def test_request_no_host_can_hold_ends_in_error_without_claims(cloud: Cloud) -> None:
    before = await hypervisor_usage(cloud)
    async with cloud.http(cloud.admin_token) as http:  # no host, rather than the quota, refuses
        quota = await http.put(
            f"os-quota-sets/{ADMIN['project_id']}", json={"quota_set": {"ram": -1}}
        )
        assert quota.status_code == 200, quota.text
    cloud.openstack(
        "flavor", "create", "--ram", str(cloud.config.memory_mb * 100), "--vcpus", "1",
        "--disk", "1", "e2e.huge",
    )  # fmt: skip
    created = cloud.openstack(
        "server", "create", "--flavor", "e2e.huge", "--image", "cirros", "too-big"
    )

    server = wait_for_status(cloud, created["id"], {"ACTIVE", "ERROR"})

    assert server["status"] == "ERROR"
    assert "No valid host was found" in server["fault"]["message"]
    assert await hypervisor_usage(cloud) == before
    async with cloud.pool.acquire() as conn:
        claims = await conn.fetchval(
            "SELECT count(*) FROM allocations WHERE instance_uuid = $1", created["id"]
        )
    assert claims == 0


async def test_api_refuses_missing_tokens_members_and_bad_input(cloud: Cloud) -> None:
    async with cloud.http() as anonymous:
        assert (await anonymous.get("servers")).status_code == 401
    async with cloud.http(cloud.member_token) as member:
        assert (await member.get("os-hypervisors")).status_code == 403
        assert (await member.get("servers")).status_code == 200
    async with cloud.http(cloud.admin_token) as admin:
        malformed = await admin.post(
            "servers", content=b'{"server": {"name": ', headers={"Content-Type": "application/json"}
        )
        wrong_types = await admin.post(
            "servers",
            json={"server": {"name": 42, "flavorRef": ["1"], "imageRef": str(CIRROS_ID)}},
        )
        not_an_object = await admin.post("servers", json=["server"])
    for response in (malformed, wrong_types, not_an_object):
        assert response.status_code == 400, response.text
        assert response.json()["badRequest"]["code"] == 400
