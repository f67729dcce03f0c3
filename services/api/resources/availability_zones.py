"""os-availability-zone: the zones servers can be created in, and (admin) what runs there.

A zone is *available* when an enabled compute service's node is in it; a zone whose
compute services are all disabled is listed as not available. ``/detail`` (admin) also
lists, per available zone, each host's services with whether they are up (``available``)
and enabled (``active``); keel-conductor and keel-scheduler are in the ``internal`` zone,
which only ``/detail`` shows, as in Nova.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import AdminContext, Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool
from services.api.views.os_services import INTERNAL_ZONE, service_zone
from services.api.views.timestamps import naive_isotime
from shared.db import services
from shared.db.pool import Connection
from shared.objects.service import Service

router = APIRouter(prefix="/v2.1/os-availability-zone")


async def _zoned_services(conn: Connection, down_time: float) -> list[tuple[str, Service]]:
    """Every service with its zone (``internal`` for control services)."""
    found = await services.list_with_zones(conn, down_time)
    zones = {s.id: zone for s, zone in found if zone is not None}
    return [(service_zone(s, zones), s) for s, _ in found]


def _split(zoned: list[tuple[str, Service]]) -> tuple[list[str], list[str]]:
    """Available zones (an enabled service in them), then the others, each sorted."""
    available = sorted({zone for zone, s in zoned if not s.disabled})
    unavailable = sorted({zone for zone, s in zoned if s.disabled} - set(available))
    return available, unavailable


def _zone(name: str, available: bool, hosts: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"zoneName": name, "zoneState": {"available": available}, "hosts": hosts}


@router.get("", dependencies=[NO_QUERY_FROM_2_102])
async def list_zones(pool: DbPool, ctx: Context, settings: AppSettings) -> dict[str, Any]:
    async with pool.acquire() as conn:
        zoned = await _zoned_services(conn, settings.service_down_time)
    available, unavailable = _split(zoned)
    return {
        "availabilityZoneInfo": [_zone(z, True) for z in available if z != INTERNAL_ZONE]
        + [_zone(z, False) for z in unavailable if z != INTERNAL_ZONE]
    }


def _hosts(zone: str, zoned: list[tuple[str, Service]]) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for service_zone_name, service in zoned:
        if service_zone_name != zone or service.disabled:
            continue
        hosts.setdefault(service.host, {})[service.binary] = {
            "available": service.is_up,
            "active": not service.disabled,
            "updated_at": naive_isotime(service.last_seen_up or service.updated_at),
        }
    return hosts


@router.get("/detail", dependencies=[NO_QUERY_FROM_2_102])
async def list_zones_detail(
    pool: DbPool, ctx: AdminContext, settings: AppSettings
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        zoned = await _zoned_services(conn, settings.service_down_time)
    available, unavailable = _split(zoned)
    return {
        "availabilityZoneInfo": [_zone(z, True, _hosts(z, zoned)) for z in available]
        + [_zone(z, False) for z in unavailable]
    }
