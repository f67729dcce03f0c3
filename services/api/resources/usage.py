"""``os-simple-tenant-usage``: what projects' servers used over a period.

A server is charged from when it launched (not when it was requested: a server that
never became active used nothing) until it was deleted (or until now, if it still
runs), within the period ``start`` to ``end`` (ISO 8601 times, UTC unless they say
otherwise; both default to now). Its
vCPU, memory and disk hours are its hours times its flavor's sizes, disk being the root
plus ephemeral disk. The list (admins) answers one entry per project, each with its
servers when ``detailed=1``; show (admins, or members for their own project) always
details. From 2.40 both page over servers with ``limit`` and ``marker``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Request

from services.api.http.auth import AdminContext, Context
from services.api.http.deps import DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest, Forbidden
from services.api.http.links import Links
from services.api.http.paging import PageRequest, marker_not_found, next_marker, page_request
from services.api.http.query import refuse_unknown
from services.api.views.timestamps import naive_isotime
from shared.db import usage
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance

router = APIRouter(prefix="/v2.1/os-simple-tenant-usage")

PAGING_VERSION = "2.40"
_SECONDS_PER_HOUR = 3600.0


def parse_time(value: str | None, now: datetime) -> datetime:
    """An ISO 8601 time (naive means UTC); ``now`` when absent; 400 when malformed."""
    if not value:
        return now
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BadRequest(
            f"Invalid datetime string: {value!r} is not a time like 2024-05-01T12:00:00"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime
    detailed: bool
    paging: PageRequest
    now: datetime

    @classmethod
    def from_request(cls, request: Request, paged: bool) -> Period:
        params = request.query_params
        now = datetime.now(UTC)
        start, end = parse_time(params.get("start"), now), parse_time(params.get("end"), now)
        if not start < end:
            raise BadRequest("Invalid start time. The start time cannot occur after the end time.")
        paging = page_request(params.get("limit"), params.get("marker"))
        if not paged:
            paging = page_request(None, None)
        detailed = params.get("detailed", "0").strip().lower() in ("1", "true", "yes")
        return cls(start, end, detailed, paging, now)

    def hours(self, instance: Instance) -> float:
        """Hours the instance ran within the period (so far, if it still runs)."""
        if instance.launched_at is None:
            return 0.0
        begin = max(instance.launched_at, self.start)
        stop = min(instance.terminated_at or self.now, self.end)
        return max((stop - begin).total_seconds(), 0.0) / _SECONDS_PER_HOUR


def server_usage(instance: Instance, period: Period) -> dict[str, Any]:
    flavor = instance.flavor
    ended = instance.terminated_at
    started = instance.launched_at or instance.created_at
    return {
        "instance_id": str(instance.uuid),
        "name": instance.display_name,
        "tenant_id": instance.project_id,
        "flavor": flavor.name,
        "hours": period.hours(instance),
        "vcpus": flavor.vcpus,
        "memory_mb": flavor.memory_mb,
        "local_gb": flavor.disk_gb,
        "started_at": naive_isotime(started),
        "ended_at": naive_isotime(ended),
        "state": "terminated" if ended else instance.vm_state,
        "uptime": int(((ended or period.now) - started).total_seconds()),
    }


def summarise(found: Sequence[Instance], period: Period) -> list[dict[str, Any]]:
    """One usage entry per project, in the order the projects first appear."""
    projects: dict[str, dict[str, Any]] = {}
    for instance in found:
        info = server_usage(instance, period)
        entry = projects.setdefault(
            instance.project_id,
            {
                "tenant_id": instance.project_id,
                "total_local_gb_usage": 0.0,
                "total_vcpus_usage": 0.0,
                "total_memory_mb_usage": 0.0,
                "total_hours": 0.0,
                "start": naive_isotime(period.start),
                "stop": naive_isotime(period.end),
                **({"server_usages": []} if period.detailed else {}),
            },
        )
        entry["total_local_gb_usage"] += info["local_gb"] * info["hours"]
        entry["total_vcpus_usage"] += info["vcpus"] * info["hours"]
        entry["total_memory_mb_usage"] += info["memory_mb"] * info["hours"]
        entry["total_hours"] += info["hours"]
        if period.detailed:
            entry["server_usages"].append(info)
    return list(projects.values())


async def _instances(pool: asyncpg.Pool, period: Period, project_id: str | None) -> list[Instance]:
    marker = period.paging.marker
    try:
        marker_uuid = None if marker is None else UUID(marker)
        async with pool.acquire() as conn:
            return await usage.active_between(
                conn,
                period.start,
                period.end,
                project_id=project_id,
                marker=marker_uuid,
                limit=period.paging.limit,
            )
    except (ValueError, InstanceNotFound):
        raise marker_not_found(str(marker)) from None


def _links(request: Request, links: Links, path: str, marker: str | None) -> list[dict[str, str]]:
    if marker is None:
        return []
    params = [(k, v) for k, v in request.query_params.multi_items() if k != "marker"]
    href = f"{links.compute(path)}?{urlencode([*params, ('marker', marker)])}"
    return [{"rel": "next", "href": href}]


@router.get("")
async def list_usage(
    request: Request, ctx: AdminContext, pool: DbPool, version: Version, links: RequestLinks
) -> dict[str, Any]:
    refuse_unknown(request.query_params, {"start", "end", "detailed", "limit", "marker"}, version)
    period = Period.from_request(request, version.at_least(PAGING_VERSION))
    found = await _instances(pool, period, None)
    body: dict[str, Any] = {"tenant_usages": summarise(found, period)}
    after = next_marker(found, period.paging, key=lambda i: str(i.uuid))
    if next_links := _links(request, links, "os-simple-tenant-usage", after):
        body["tenant_usages_links"] = next_links
    return body


@router.get("/{project_id}")
async def show_usage(
    project_id: str,
    request: Request,
    *,
    ctx: Context,
    pool: DbPool,
    version: Version,
    links: RequestLinks,
) -> dict[str, Any]:
    if project_id != ctx.project_id and not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow reading another project's usage: it needs the admin role."
        )
    refuse_unknown(request.query_params, {"start", "end", "limit", "marker"}, version)
    period = Period.from_request(request, version.at_least(PAGING_VERSION))
    period = dataclasses.replace(period, detailed=True)
    found = await _instances(pool, period, project_id)
    entries = summarise(found, period)
    body: dict[str, Any] = {"tenant_usage": entries[0] if entries else {}}
    after = next_marker(found, period.paging, key=lambda i: str(i.uuid))
    if next_links := _links(request, links, f"os-simple-tenant-usage/{project_id}", after):
        body["tenant_usage_links"] = next_links
    return body
