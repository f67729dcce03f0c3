"""os-hypervisors bodies: ids by microversion, detail fields."""

from __future__ import annotations

from services.api.http.microversion import APIVersion
from services.api.views.hypervisors import hypervisor_view
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
