"""os-services bodies: integer ids below 2.53, UUIDs from 2.53; ``forced_down`` from 2.11."""

from __future__ import annotations

from typing import Any

from services.api.http.microversion import APIVersion
from services.api.views.timestamps import naive_isotime
from shared.objects.service import Binary, Service

#: The zone Nova shows for services that are not compute agents.
INTERNAL_ZONE = "internal"
DEFAULT_ZONE = "nova"


def service_zone(service: Service, zones: dict[int, str]) -> str:
    """``internal`` for control services; a compute agent's node availability zone."""
    if service.binary != Binary.COMPUTE:
        return INTERNAL_ZONE
    return zones.get(service.id, DEFAULT_ZONE)


def service_view(service: Service, version: APIVersion, zone: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(service.uuid) if version.at_least("2.53") else service.id,
        "binary": service.binary,
        "host": service.host,
        "zone": zone,
        "status": "disabled" if service.disabled else "enabled",
        "state": "up" if service.is_up else "down",
        "updated_at": naive_isotime(service.last_seen_up or service.updated_at),
        "disabled_reason": service.disabled_reason,
    }
    if version.at_least("2.11"):
        body["forced_down"] = service.forced_down
    return body
