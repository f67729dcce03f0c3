"""``GET /servers/{id}/diagnostics`` (admin): what the server's driver knows of its guest.

The server's agent asks its driver (compute RPC 1.10, ``get_instance_diagnostics``). From
2.48 the answer has the standard shape: ``state``, ``driver``, ``hypervisor``,
``hypervisor_os``, ``uptime``, ``config_drive``, ``num_cpus``/``num_nics``/``num_disks``
and their details, ``memory_details``. Below 2.48 it is the flat, driver-shaped dict
Nova's libvirt driver answers (``cpu0_time``, ``memory``, ``memory-actual``,
``vda_read``...).

A server with no host yet, or whose guest is being deleted or moved, or whose host's
agent is down or too old, is a 409; a guest its agent does not know is a 404.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from fastapi import APIRouter

from services.api.http.auth import AdminContext
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, Compute, DbPool, Version
from services.api.http.faults import ConflictingRequest, ItemNotFound, ServiceUnavailable
from services.api.http.microversion import APIVersion
from services.api.servers.console import BUSY_TASKS
from services.api.servers.lookup import find_instance, host_service
from services.api.servers.power import too_old
from services.compute.rpcapi import ComputeAPI, GuestDiagnostics
from shared.context import RequestContext
from shared.exceptions import GuestNotFound, MessagingError, ServiceTooOld, Unroutable
from shared.objects.instance import Instance

router = APIRouter(prefix="/v2.1/servers")

_METHOD = "get_instance_diagnostics"
_ACTION = "get_diagnostics"
STANDARD_VERSION = "2.48"


def standard_view(found: GuestDiagnostics) -> dict[str, Any]:
    body: dict[str, Any] = found.model_dump(mode="json")
    body["num_cpus"] = len(found.cpu_details)
    body["num_nics"] = len(found.nic_details)
    body["num_disks"] = len(found.disk_details)
    return body


def legacy_view(found: GuestDiagnostics) -> dict[str, Any]:
    """The shape Nova's libvirt driver answered before 2.48 (memory in KiB)."""
    body: dict[str, Any] = {}
    for cpu in found.cpu_details:
        body[f"cpu{cpu.id}_time"] = cpu.time or 0
    memory = found.memory_details
    body["memory"] = (memory.maximum or 0) * 1024
    body["memory-actual"] = (memory.used or 0) * 1024
    for index, disk in enumerate(found.disk_details):
        name = f"vd{chr(ord('a') + index)}"
        body[f"{name}_read"] = disk.read_bytes or 0
        body[f"{name}_read_req"] = disk.read_requests or 0
        body[f"{name}_write"] = disk.write_bytes or 0
        body[f"{name}_write_req"] = disk.write_requests or 0
        body[f"{name}_errors"] = disk.errors_count if disk.errors_count is not None else -1
    for index, nic in enumerate(found.nic_details):
        body[f"tap{index}_rx"] = nic.rx_octets or 0
        body[f"tap{index}_tx"] = nic.tx_octets or 0
    return body


async def read_diagnostics(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    *,
    ctx: RequestContext,
    instance: Instance,
    down_time: float,
) -> GuestDiagnostics:
    if not instance.host:
        raise ConflictingRequest(f"Instance {instance.uuid} is not ready: it has no host yet.")
    if instance.task_state in BUSY_TASKS:
        raise ConflictingRequest(
            f"Cannot '{_ACTION}' instance {instance.uuid} while it is in task_state "
            f"{instance.task_state}"
        )
    if not await compute.can_send(_METHOD):
        reason = await too_old(pool, compute, _ACTION, _METHOD, down_time)
        raise ConflictingRequest(f"Cannot '{_ACTION}' instance {instance.uuid}: {reason}.")
    service = await host_service(pool, instance, down_time)
    if service is None or not service.is_up:
        raise ConflictingRequest(
            f"Instance {instance.uuid} is not ready: the compute service of host "
            f"{instance.host} is down."
        )
    try:
        return await compute.get_instance_diagnostics(ctx, service.uuid, instance.uuid)
    except GuestNotFound as exc:
        raise ItemNotFound(f"No guest of {instance.uuid} on its host: {exc.message}") from None
    except (ServiceTooOld, Unroutable) as exc:
        raise ConflictingRequest(
            f"Cannot '{_ACTION}' instance {instance.uuid}: {exc.message}."
        ) from None
    except MessagingError as exc:
        raise ServiceUnavailable(
            f"The compute agent of host {service.host} did not answer: {exc.message}"
        ) from None


def diagnostics_view(found: GuestDiagnostics, version: APIVersion) -> dict[str, Any]:
    return standard_view(found) if version.at_least(STANDARD_VERSION) else legacy_view(found)


@router.get("/{server_id}/diagnostics", dependencies=[NO_QUERY_FROM_2_102])
async def show_diagnostics(
    server_id: str,
    *,
    pool: DbPool,
    ctx: AdminContext,
    compute: Compute,
    version: Version,
    settings: AppSettings,
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    found = await read_diagnostics(
        pool, compute, ctx=ctx, instance=instance, down_time=settings.service_down_time
    )
    return diagnostics_view(found, version)
