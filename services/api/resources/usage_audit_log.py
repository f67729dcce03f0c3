"""``os-instance_usage_audit_log``: the state of the instance usage audit (admins only).

Nova's compute hosts can run a periodic task that emits a usage notification for every
server over each audit period (a month by default) and log its progress; this route
reports that log for the last period completed before now (``GET``) or before a given
time (``GET /{before}``, ``YYYY-MM-DD HH:MM:SS[.ffffff]``, UTC; anything else is a 400).

keel sends no usage notifications, so no host ever runs that audit: like Nova with the
audit turned off (its default), the answer lists every compute service that is not
deleted, disabled ones included, as not run, with no errors and no instances. Usage
itself is served by ``os-simple-tenant-usage``, which keel computes from the servers'
lifetimes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from services.api.http.auth import AdminContext
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import BadRequest
from shared.db import services
from shared.objects.service import Binary

router = APIRouter(prefix="/v2.1/os-instance_usage_audit_log")


def parse_before(value: str) -> datetime:
    """``YYYY-MM-DD HH:MM:SS``, with or without fractions of a second; 400 otherwise."""
    shape = "%Y-%m-%d %H:%M:%S.%f" if "." in value else "%Y-%m-%d %H:%M:%S"
    try:
        return datetime.strptime(value, shape)
    except ValueError:
        raise BadRequest(
            f"Invalid timestamp for date {value}: it must be like 2024-05-01 12:00:00"
        ) from None


def _month_start(year: int, month: int) -> datetime:
    while month < 1:
        month += 12
        year -= 1
    return datetime(year, month, 1)


def audit_period(before: datetime) -> tuple[datetime, datetime]:
    """The last monthly audit period (Nova's default) completed before ``before``."""
    end = _month_start(before.year, before.month)
    if end >= before:
        end = _month_start(before.year, before.month - 1)
    return _month_start(end.year, end.month - 1), end


async def audit_log(pool: DbPool, settings: AppSettings, before: datetime) -> dict[str, Any]:
    begin, end = audit_period(before)
    async with pool.acquire() as conn:
        computes = await services.list_services(
            conn, settings.service_down_time, binary=Binary.COMPUTE.value
        )
    hosts = sorted({service.host for service in computes})
    return {
        "period_beginning": str(begin),
        "period_ending": str(end),
        "num_hosts": len(hosts),
        "num_hosts_done": 0,
        "num_hosts_running": 0,
        "num_hosts_not_run": len(hosts),
        "hosts_not_run": hosts,
        "total_instances": 0,
        "total_errors": 0,
        "overall_status": f"{'ALL' if not hosts else f'0 of {len(hosts)}'} hosts done. 0 errors.",
        "log": {},
    }


@router.get("", dependencies=[NO_QUERY_FROM_2_102])
async def index(ctx: AdminContext, pool: DbPool, settings: AppSettings) -> dict[str, Any]:
    now = datetime.now(UTC).replace(tzinfo=None)  # periods are naive UTC, as Nova's
    return {"instance_usage_audit_logs": await audit_log(pool, settings, now)}


@router.get("/{before}", dependencies=[NO_QUERY_FROM_2_102])
async def show(
    before: str, ctx: AdminContext, pool: DbPool, settings: AppSettings
) -> dict[str, Any]:
    return {"instance_usage_audit_log": await audit_log(pool, settings, parse_before(before))}
