"""What Nova users type, with the real openstack CLI: several servers at once, an empty
page, pause/unpause, suspend/resume and the console log that shows them, shelve and
unshelve."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cloud import Cloud
from tests.e2e.test_compute_cloud import wait_for_status

pytestmark = pytest.mark.e2e


def statuses(cloud: Cloud) -> dict[str, str]:
    return {s["Name"]: s["Status"] for s in cloud.openstack("server", "list")}


# Eight runs of the `openstack` client and its polls, each starting a Python client:
# minutes on a loaded two-core machine, past the tier's default limit.
@pytest.mark.timeout(300)
def test_three_servers_from_one_create_and_an_empty_page(cloud: Cloud) -> None:
    cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--min", "3",
        "--max", "3", "trio",
    )  # fmt: skip
    listed = cloud.openstack("server", "list", "--long")
    names = sorted(s["Name"] for s in listed)
    assert names == ["trio-1", "trio-2", "trio-3"]
    for server in listed:
        assert wait_for_status(cloud, server["ID"], {"ACTIVE", "ERROR"})["status"] == "ACTIVE"
    assert cloud.openstack("server", "list", "--limit", "0") == []
    assert len(cloud.openstack("server", "list", "--limit", "2")) == 2

    cloud.openstack("server", "delete", "--wait", *(s["ID"] for s in listed), as_json=False)
    assert cloud.openstack("server", "list") == []


def test_pause_unpause_suspend_resume_and_the_console_log(cloud: Cloud) -> None:
    server: dict[str, Any] = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "sleeper"
    )
    sid = server["id"]
    seen = []
    for action, settled in (
        ("pause", "PAUSED"),
        ("unpause", "ACTIVE"),
        ("suspend", "SUSPENDED"),
        ("resume", "ACTIVE"),
    ):
        cloud.openstack("server", action, "sleeper", as_json=False)
        shown = wait_for_status(cloud, sid, {settled})
        seen.append((action, shown["status"], shown["OS-EXT-STS:power_state"]))
    log = cloud.openstack("console", "log", "show", "sleeper", as_json=False)
    actions = cloud.openstack("server", "event", "list", "sleeper")
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)

    assert seen == [
        ("pause", "PAUSED", 3),
        ("unpause", "ACTIVE", 1),
        ("suspend", "SUSPENDED", 4),
        ("resume", "ACTIVE", 1),
    ]
    for line in ("paused", "unpaused", "suspended: memory saved", "resumed from its saved memory"):
        assert line in log
    assert [a["Action"] for a in actions][:4] == ["resume", "suspend", "unpause", "pause"]


def test_shelve_offloads_and_unshelve_brings_it_back_from_its_shelved_image(
    cloud: Cloud,
) -> None:
    server: dict[str, Any] = cloud.openstack(
        "server", "create", "--flavor", "m1.tiny", "--image", "cirros", "--wait", "shelf"
    )
    sid = server["id"]

    cloud.openstack("server", "shelve", "shelf", as_json=False)
    offloaded = wait_for_status(cloud, sid, {"SHELVED_OFFLOADED", "ERROR"})
    shelved_images = cloud.openstack("image", "list", "--name", "shelf-shelved")
    cloud.openstack("server", "unshelve", "shelf", as_json=False)
    back = wait_for_status(cloud, sid, {"ACTIVE", "ERROR"})
    left = cloud.openstack("image", "list", "--name", "shelf-shelved")
    actions = cloud.openstack("server", "event", "list", "shelf")
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)

    assert offloaded["status"] == "SHELVED_OFFLOADED"
    assert offloaded["OS-EXT-SRV-ATTR:host"] is None
    assert [i["Status"] for i in shelved_images] == ["active"]
    assert back["status"] == "ACTIVE"
    assert back["OS-EXT-SRV-ATTR:host"]
    assert left == []
    assert [a["Action"] for a in actions][:2] == ["unshelve", "shelve"]


async def test_a_hypervisors_uptime_comes_from_its_agent(cloud: Cloud) -> None:
    listed = await cloud.get("os-hypervisors", version="2.53")
    for hypervisor in listed["hypervisors"]:
        shown = await cloud.get(f"os-hypervisors/{hypervisor['id']}/uptime", version="2.53")
        assert shown["hypervisor"]["hypervisor_hostname"] == hypervisor["hypervisor_hostname"]
        assert " up " in shown["hypervisor"]["uptime"]
        assert "load average" in shown["hypervisor"]["uptime"]
