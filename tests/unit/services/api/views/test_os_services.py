"""os-services bodies: ids by microversion, zones, up/down."""

from __future__ import annotations

from services.api.http.microversion import APIVersion
from services.api.views.os_services import service_view, service_zone
from tests.unit.services.api.factories import SERVICE_UUID, service


def test_integer_id_below_2_53() -> None:
    body = service_view(service(), APIVersion(2, 52), "nova")
    assert body["id"] == 3
    assert body["forced_down"] is False


def test_uuid_id_from_2_53() -> None:
    assert service_view(service(), APIVersion(2, 53), "nova")["id"] == str(SERVICE_UUID)


def test_forced_down_from_2_11() -> None:
    assert "forced_down" not in service_view(service(), APIVersion(2, 10), "nova")


def test_state_status_and_heartbeat_time() -> None:
    body = service_view(
        service(disabled=True, disabled_reason="maintenance", is_up=False), APIVersion(2, 1), "az1"
    )
    assert body["status"] == "disabled"
    assert body["state"] == "down"
    assert body["disabled_reason"] == "maintenance"
    assert body["zone"] == "az1"
    assert body["updated_at"] == "2024-05-01T12:00:00.123456"


def test_zone_is_internal_for_control_services() -> None:
    assert service_zone(service(binary="keel-conductor"), {3: "az1"}) == "internal"
    assert service_zone(service(binary="keel-scheduler"), {}) == "internal"
    assert service_zone(service(), {3: "az1"}) == "az1"
    assert service_zone(service(), {}) == "nova"
