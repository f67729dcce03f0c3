"""Soft delete, as Nova has it: ``DELETE`` keeps the server a while; ``restore`` and
``forceDelete`` (os-deferred-delete).

With ``KEEL_RECLAIM_INSTANCE_INTERVAL`` above 0, ``DELETE`` of a server that is ACTIVE or
SHUTOFF with no task does not destroy it: task ``soft-deleting`` and
``soft_delete_instance`` cast to its agent, which powers the guest off and reports it;
the server is then SOFT_DELETED, its claims and addresses kept (its quota still counts).
Its owner may then

* ``restore`` it: SOFT_DELETED with no task → task ``restoring``; the agent powers the
  guest on and the server is ACTIVE again. Like ``os-start``: 409 while its host's
  compute service is down, or while a stray copy of an unfinished move may run;
* ``forceDelete`` it: a delete as without soft delete (by its agent, or locally while
  that agent is down). As in Nova, ``forceDelete`` deletes a server in any state.

The conductors delete for good the servers soft-deleted longer than the interval
(:mod:`services.conductor.reclaim`).

Everything else is deleted at once, as without soft delete (Nova deletes what it cannot
soft-delete): a server never placed, building, in ERROR, VERIFY_RESIZE, paused or
suspended, or in a task; and a server whose host's compute service is down or gone (a
local delete: its guest's files remain there until its agent runs again). ``DELETE`` of
a server already SOFT_DELETED changes nothing (its reclaim clock is not restarted):
``forceDelete`` deletes it at once. With the interval back at 0, ``DELETE`` deletes a
soft-deleted server at once too.

Soft delete and restore are compute RPC 1.13 methods whose results are conductor RPC
1.15: while the deployment's caps are lower, both are refused with 409 naming the
services that are too old (``forceDelete`` is not: it is a delete), and nothing is
changed. A cast that cannot be confirmed sent is withdrawn as a stop's is (409 or 503).
"""

from __future__ import annotations

import asyncpg

from services.api.http.faults import ConflictingRequest
from services.api.servers.delete import delete_server
from services.api.servers.lookup import host_service
from services.api.servers.power import PowerAction, run_power_action
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from services.conductor.rpcapi import PowerAction as ResultAction
from shared.config import Settings
from shared.context import RequestContext
from shared.objects.instance import Instance
from shared.objects.states import TaskState, VmState
from shared.objects.transitions import SOFT_DELETABLE

RESTORE_ACTION = "restore"
FORCE_DELETE_ACTION = "forceDelete"

SOFT_DELETE = PowerAction(
    "delete",
    "soft_delete_instance",
    TaskState.SOFT_DELETING,
    tuple(VmState(vm) for vm in SOFT_DELETABLE),
    result=ResultAction.SOFT_DELETE,
)
RESTORE = PowerAction(
    RESTORE_ACTION, "restore_instance", TaskState.RESTORING, (VmState.SOFT_DELETED,)
)


def soft_deletable(instance: Instance) -> bool:
    """Whether a DELETE with soft delete on keeps this server (see the module docstring)."""
    return (
        instance.host is not None
        and instance.task_state is None
        and instance.vm_state in SOFT_DELETABLE
    )


async def delete(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
) -> None:
    """``DELETE /servers/{id}``: a soft delete where it applies, else a delete."""
    down_time = settings.service_down_time
    if settings.reclaim_instance_interval > 0:
        if instance.vm_state == VmState.SOFT_DELETED and instance.task_state is None:
            return
        if soft_deletable(instance):
            service = await host_service(pool, instance, down_time)
            if service is not None and service.is_up:
                await run_power_action(
                    pool,
                    compute,
                    settings=settings,
                    ctx=ctx,
                    instance=instance,
                    action=SOFT_DELETE,
                    conductor=conductor,
                )
                return
    await delete_server(pool, compute, ctx, instance, down_time)


async def restore(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
) -> None:
    """``restore``: SOFT_DELETED → ACTIVE by its agent (see the module docstring)."""
    if instance.vm_state != VmState.SOFT_DELETED:
        raise ConflictingRequest(
            f"Cannot 'restore' instance {instance.uuid} while it is in vm_state {instance.vm_state}"
        )
    service = await host_service(pool, instance, settings.service_down_time)
    if service is not None and not service.is_up:
        raise ConflictingRequest(
            f"Cannot 'restore' instance {instance.uuid}: the compute service of host "
            f"{service.host} is down, and only its agent can power the guest on. Bring it "
            "back, or delete the server with forceDelete."
        )
    await run_power_action(
        pool,
        compute,
        settings=settings,
        ctx=ctx,
        instance=instance,
        action=RESTORE,
        conductor=conductor,
    )


async def force_delete(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
) -> None:
    """``forceDelete``: a delete as without soft delete, whatever the server's state."""
    await delete_server(pool, compute, ctx, instance, settings.service_down_time)
