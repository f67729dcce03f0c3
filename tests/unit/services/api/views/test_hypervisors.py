"""os-hypervisors bodies: ids by microversion, detail fields."""

from __future__ import annotations

from services.api.http.microversion import APIVersion
from services.api.views.hypervisors import hypervisor_view, with_servers
from tests.unit.services.api.factories import NODE_UUID, SERVICE_UUID, host_state


def test_list_entry_at_2_1() -> None:
    assert hypervisor_view(host_state(), APIVersion(2, 1), detail=False) == {
        "id": 5,
        "hypervisor_hostname": "compute-1.example",
        "state": "up",
        "status": "enabled",
    }


def test_uuids_from_2_53() -> None:
    body = hypervisor_view(host_state(), APIVersion(2, 53), detail=True)
    assert body["id"] == str(NODE_UUID)
    assert body["service"] == {
        "host": "compute-1",
        "id": str(SERVICE_UUID),
        "disabled_reason": None,
    }


def test_detail_capacity_and_usage() -> None:
    body = hypervisor_view(host_state(up=False, disabled=True), APIVersion(2, 1), detail=True)
    assert body["state"] == "down"
    assert body["status"] == "disabled"
    assert body["service"]["id"] == 3
    assert (body["vcpus"], body["vcpus_used"]) == (8, 2)
    assert (body["memory_mb"], body["memory_mb_used"], body["free_ram_mb"]) == (16384, 1024, 15360)
    assert (body["local_gb"], body["local_gb_used"], body["free_disk_gb"]) == (100, 10, 90)
    assert body["running_vms"] == 2
    assert body["cpu_info"] == "{}"


def test_cpu_info_is_an_object_from_2_28() -> None:
    assert hypervisor_view(host_state(), APIVersion(2, 28), detail=True)["cpu_info"] == {}


def test_from_2_88_the_detail_shows_uptime_instead_of_figures() -> None:
    uptime = " 10:00:00 up 3 days,  load average: 0.00, 0.01, 0.05"
    body = hypervisor_view(host_state(), APIVersion(2, 88), detail=True, uptime=uptime)
    assert body["uptime"] == uptime
    assert body["service"]["id"] == str(SERVICE_UUID)
    assert body["hypervisor_type"]
    for gone in ("vcpus", "memory_mb_used", "local_gb", "running_vms", "cpu_info"):
        assert gone not in body
    older = hypervisor_view(host_state(), APIVersion(2, 87), detail=True, uptime=uptime)
    assert "uptime" not in older
    assert older["vcpus"] == 8
    assert "cpu_info" in older
    assert "uptime" not in hypervisor_view(host_state(), APIVersion(2, 88), detail=False)


def test_servers_are_always_listed_when_asked_for_from_2_75() -> None:
    assert "servers" not in with_servers({}, [], APIVersion(2, 74))
    assert with_servers({}, [], APIVersion(2, 75)) == {"servers": []}
