"""Server bodies across microversions, for members and admins."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.servers.views import (
    STATUS_FILTERS,
    TASK_STATUS_FILTERS,
    ServerView,
    created_body,
    server_status,
)
from shared.db.request_specs import Asked
from shared.objects.instance import InstanceFault
from shared.objects.network import FixedIp, mac_address
from tests.unit.services.api.factories import CREATED, INSTANCE_UUID, instance

LINKS = Links("http://api.example:8774/")
NETWORK_ID = uuid.UUID("0e0e0e0e-0000-4000-8000-000000000001")


def view(version: str = "2.1", *, admin: bool = False, **kw: Any) -> ServerView:
    return ServerView(version=APIVersion.parse(version), links=LINKS, is_admin=admin, **kw)


@pytest.mark.parametrize(
    ("vm_state", "status"),
    [
        ("building", "BUILD"),
        ("active", "ACTIVE"),
        ("stopped", "SHUTOFF"),
        ("error", "ERROR"),
        ("deleted", "DELETED"),
        ("soft-delete", "SOFT_DELETED"),
        ("mystery", "UNKNOWN"),
    ],
)
def test_status_from_vm_state(vm_state: str, status: str) -> None:
    assert server_status(vm_state) == status


def test_status_filters_select_vm_states() -> None:
    assert STATUS_FILTERS["BUILD"] == ("building",)
    assert STATUS_FILTERS["SHUTOFF"] == ("stopped",)
    assert STATUS_FILTERS["PAUSED"] == ("paused",)
    assert STATUS_FILTERS["SHELVED"] == ("shelved",)
    assert STATUS_FILTERS["SHELVED_OFFLOADED"] == ("shelved_offloaded",)
    assert STATUS_FILTERS["RESCUE"] == ()


def test_shelved_servers_show_as_nova_shows_them() -> None:
    """SHELVED and SHELVED_OFFLOADED whatever the task (an offload or unshelve under way)."""
    assert server_status("shelved", "shelving_offloading") == "SHELVED"
    assert server_status("shelved", "unshelving") == "SHELVED"
    assert server_status("shelved_offloaded", "spawning") == "SHELVED_OFFLOADED"
    assert server_status("active", "shelving") == "ACTIVE"


def test_soft_deleted_servers_show_and_filter_as_nova_shows_them() -> None:
    """SOFT_DELETED is a status of its own whatever the task (a restore under way too),
    and selects exactly the soft-deleted servers."""
    assert STATUS_FILTERS["SOFT_DELETED"] == ("soft-delete",)
    assert server_status("soft-delete", "restoring") == "SOFT_DELETED"
    assert server_status("active", "soft-deleting") == "ACTIVE"


def test_summary() -> None:
    body = view().summary(instance())
    assert body["id"] == "6f1a5e2c-0000-4000-8000-000000000001"
    assert body["name"] == "web-1"
    assert body["links"][0] == {
        "rel": "self",
        "href": "http://api.example:8774/v2.1/servers/6f1a5e2c-0000-4000-8000-000000000001",
    }


def test_detail_basics_for_a_new_server() -> None:
    body = view().detail(instance())
    assert body["status"] == "BUILD"
    assert body["tenant_id"] == "team"
    assert body["created"] == "2024-05-01T12:00:00Z"
    assert body["updated"] == "2024-05-01T12:00:00Z"
    assert body["hostId"] == ""
    assert body["progress"] == 0
    assert body["addresses"] == {}
    assert body["OS-EXT-STS:task_state"] == "scheduling"
    assert body["OS-SRV-USG:launched_at"] is None
    assert body["os-extended-volumes:volumes_attached"] == []


def test_image_is_an_object_or_empty_string_never_null() -> None:
    image = view().detail(instance())["image"]
    assert image["id"] == "11111111-2222-3333-4444-555555555555"
    assert view().detail(instance(image_ref=""))["image"] == ""


def test_flavor_is_a_reference_below_2_47() -> None:
    flavor = view("2.46").detail(instance())["flavor"]
    assert flavor["id"] == "1"
    assert flavor["links"][0]["href"] == "http://api.example:8774/flavors/1"


def test_flavor_is_embedded_from_2_47() -> None:
    flavor = view("2.47").detail(instance())["flavor"]
    assert flavor == {
        "vcpus": 1,
        "ram": 512,
        "disk": 1,
        "ephemeral": 0,
        "swap": 0,
        "original_name": "m1.tiny",
        "extra_specs": {},
    }


def test_placement_details_are_for_admins_only() -> None:
    placed = instance(host="h1", node="h1-node", vm_state="active", task_state=None)
    member = view("2.73").detail(placed)
    admin = view("2.73", admin=True, host_statuses={"h1": "UP"}).detail(placed)
    assert not any(key.startswith("OS-EXT-SRV-ATTR") for key in member)
    assert "host_status" not in member
    assert admin["OS-EXT-SRV-ATTR:host"] == "h1"
    assert admin["OS-EXT-SRV-ATTR:hypervisor_hostname"] == "h1-node"
    assert admin["OS-EXT-SRV-ATTR:instance_name"] == "instance-00000007"
    assert admin["host_status"] == "UP"
    assert member["hostId"] == admin["hostId"] != ""


def test_host_status_needs_2_16() -> None:
    placed = instance(host="h1")
    assert "host_status" not in view("2.15", admin=True).detail(placed)
    assert view("2.16", admin=True).detail(placed)["host_status"] == "UNKNOWN"
    assert view("2.16", admin=True).detail(instance())["host_status"] == ""


def test_fault_details_are_hidden_from_members_for_500s() -> None:
    fault = InstanceFault(
        code=500, message="No valid host was found.", details="x", created=CREATED
    )
    failed = instance(vm_state="error", task_state=None, fault=fault)
    member = view().detail(failed)["fault"]
    assert member == {"code": 500, "created": "2024-05-01T12:00:00Z", "message": fault.message}
    assert view(admin=True).detail(failed)["fault"]["details"] == "x"


def test_fault_is_shown_only_in_error() -> None:
    fault = InstanceFault(code=500, message="old", created=CREATED)
    assert "fault" not in view().detail(instance(vm_state="active", fault=fault))


@pytest.mark.parametrize(
    ("field", "first"),
    [
        ("locked", "2.9"),
        ("description", "2.19"),
        ("tags", "2.26"),
        ("trusted_image_certificates", "2.63"),
        ("locked_reason", "2.73"),
        ("pinned_availability_zone", "2.96"),
        ("scheduler_hints", "2.100"),
    ],
)
def test_versioned_fields_appear_at_their_version(field: str, first: str) -> None:
    major, minor = first.split(".")
    before = f"{major}.{int(minor) - 1}"
    assert field not in view(before).detail(instance())
    assert field in view(first).detail(instance())


def test_server_groups_only_on_show_from_2_71() -> None:
    assert "server_groups" not in view("2.70").detail(instance(), show=True)
    assert "server_groups" not in view("2.73").detail(instance())
    assert view("2.71").detail(instance(), show=True)["server_groups"] == []


def test_every_version_gives_the_fields_the_client_reads() -> None:
    for minor in range(1, 101):
        body = view(f"2.{minor}", admin=True).detail(instance(), show=True)
        for key in ("id", "name", "status", "image", "flavor", "links", "created"):
            assert body[key] is not None


def test_created_body() -> None:
    body = created_body(instance(), LINKS, "s3cret")
    assert body["id"] == "6f1a5e2c-0000-4000-8000-000000000001"
    assert body["OS-DCF:diskConfig"] == "MANUAL"
    assert body["adminPass"] == "s3cret"


def test_addresses_metadata_and_zone_of_a_placed_server() -> None:
    placed = instance(host="compute-1", node="compute-1", metadata={"role": "web"})
    held = FixedIp(
        network_id=NETWORK_ID,
        network_name="private",
        address="10.0.0.2",
        mac=mac_address(NETWORK_ID, "10.0.0.2"),
    )
    shown = view(
        addresses={placed.uuid: [held]}, node_zones={("compute-1", "compute-1"): "nova"}
    ).detail(placed)
    assert shown["addresses"] == {
        "private": [
            {
                "version": 4,
                "addr": "10.0.0.2",
                "OS-EXT-IPS:type": "fixed",
                "OS-EXT-IPS-MAC:mac_addr": held.mac,
            }
        ]
    }
    assert held.mac.startswith("02:")
    assert held.mac.endswith(":0a:00:00:02")
    assert shown["metadata"] == {"role": "web"}
    assert shown["OS-EXT-AZ:availability_zone"] == "nova"


def test_zone_before_placement_is_the_one_asked_for() -> None:
    assert view().detail(instance())["OS-EXT-AZ:availability_zone"] == ""
    asked = instance(availability_zone="az1")
    assert view().detail(asked)["OS-EXT-AZ:availability_zone"] == "az1"


def test_description_tags_and_user_data_by_version_and_role() -> None:
    described = instance(description="front end", tags=["web", "prod"], user_data="aGk=")
    assert "description" not in view("2.18").detail(described)
    assert view("2.19").detail(described)["description"] == "front end"
    assert "tags" not in view("2.25").detail(described)
    assert view("2.26").detail(described)["tags"] == ["web", "prod"]
    assert view("2.3", admin=True).detail(described)["OS-EXT-SRV-ATTR:user_data"] == "aGk="
    assert "OS-EXT-SRV-ATTR:user_data" not in view("2.2", admin=True).detail(described)
    assert "OS-EXT-SRV-ATTR:user_data" not in view("2.73").detail(described)


def test_task_statuses_select_the_vm_states_their_task_shows_on() -> None:
    assert set(STATUS_FILTERS["REBOOT"]) == {"active", "stopped", "error", "resized"}
    assert TASK_STATUS_FILTERS["RESIZE"] == ("resize_prep", "resize_migrating")
    assert TASK_STATUS_FILTERS["REVERT_RESIZE"] == ("resize_reverting",)


def test_an_update_is_answered_with_the_whole_server_from_2_75() -> None:
    placed = instance(vm_state="active", task_state=None)
    below = view("2.74").changed(placed)
    assert "OS-EXT-STS:vm_state" not in below
    assert "key_name" not in below
    whole = view("2.75").changed(placed)
    assert whole == view("2.75").detail(placed, show=True)
    assert whole["server_groups"] == []


def test_the_host_name_is_everyones_from_2_90_and_the_kept_one() -> None:
    named = instance(display_name="Web Server", hostname="db-1.example")
    assert "OS-EXT-SRV-ATTR:hostname" not in view("2.89").detail(named)
    assert view("2.90").detail(named)["OS-EXT-SRV-ATTR:hostname"] == "db-1.example"
    assert view("2.3", admin=True).detail(named)["OS-EXT-SRV-ATTR:hostname"] == "db-1.example"
    older = instance(display_name="Web Server")
    assert view("2.90").detail(older)["OS-EXT-SRV-ATTR:hostname"] == "web-server"


def test_what_the_create_asked_for_is_shown_from_its_version() -> None:
    asked = {
        INSTANCE_UUID: Asked(zone="az-1", scheduler_hints={"group": ["g"]}),
    }
    kept = instance(image_properties={"os_distro": "cirros"})
    body = view("2.100", asked=asked).detail(kept)
    assert body["pinned_availability_zone"] == "az-1"
    assert body["scheduler_hints"] == {"group": ["g"]}
    assert body["image"]["properties"] == {"os_distro": "cirros"}
    assert "properties" not in view("2.97").detail(kept)["image"]
    assert view("2.98").detail(kept)["image"]["properties"] == {"os_distro": "cirros"}
    unasked = view("2.100").detail(kept)
    assert unasked["pinned_availability_zone"] is None
    assert unasked["scheduler_hints"] == {}
    assert view("2.98").detail(instance(image_ref=""))["image"] == ""
