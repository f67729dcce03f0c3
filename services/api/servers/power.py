"""Stopping, starting and rebooting a server: ``os-stop``, ``os-start`` and ``reboot``.

Each is a compare-and-swap on the server's state, then a cast to its host's agent, as in
Nova:

* ``os-stop``: ACTIVE or ERROR with no task → task ``powering-off``; the agent shuts the
  guest down and the server becomes SHUTOFF;
* ``os-start``: SHUTOFF with no task → ``powering-on``; then ACTIVE;
* ``reboot`` SOFT: ACTIVE with no task → ``rebooting`` (status REBOOT); HARD: ACTIVE,
  SHUTOFF or ERROR, with no task or during another reboot → ``rebooting_hard`` (status
  HARD_REBOOT); then ACTIVE.

* ``pause``: ACTIVE with no task → ``pausing``; then PAUSED (power state 3); ``unpause``:
  PAUSED → ``unpausing``; then ACTIVE;
* ``suspend``: ACTIVE or PAUSED with no task → ``suspending``; then SUSPENDED (power state
  4, as Nova with libvirt shows a saved guest); ``resume``: SUSPENDED → ``resuming``;
  then ACTIVE.

A server in another state is a 409 naming the state. Starting a guest (start, hard
reboot, unpause, resume) is a 409 as well while the server's last move ended unfinished
and its destination, down but not forced down, may still run the copy it built
(:func:`refuse_while_a_stray_copy_may_run`). Stop, start and reboot are compute
RPC 1.1 methods, pause, unpause, suspend and resume 1.7 (and their results conductor RPC
1.7): while the deployment's RPC cap is lower (an agent or a conductor of an older
release is still registered, or an operator pinned it), the request is refused with 409
naming the services that are too old, and nothing is changed or sent. If the message cannot be
sent, the task is undone: 409 when the host's agent has no queue, 503 when the broker
cannot be reached.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from services.api.http.faults import ConflictingRequest, ServiceUnavailable
from services.api.servers import publish
from services.api.servers.lookup import host_service
from services.compute.rpcapi import SINCE, ComputeAPI, RebootType
from services.conductor.rpcapi import ACTION_RESULT_SINCE, ConductorAPI
from services.conductor.rpcapi import PowerAction as ResultAction
from shared import host_fencing
from shared.config import Settings
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves, services
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, Unroutable
from shared.objects.instance import Instance
from shared.objects.migration import MigrationStatus
from shared.objects.service import Binary, Service
from shared.objects.states import TaskState, VmState
from shared.versions import first_release_speaking, release_name

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PowerAction:
    """One of the actions: its name (as Nova names it), RPC method and state machine."""

    name: str
    method: str
    task: TaskState
    vm_states: tuple[VmState, ...]
    from_tasks: tuple[TaskState | None, ...] = (None,)
    #: The result the agent reports for it, when not named as the action is (a soft
    #: delete is recorded as ``delete`` but reported as ``soft_delete``).
    result: ResultAction | None = None


STOP = PowerAction("stop", "stop_instance", TaskState.POWERING_OFF, (VmState.ACTIVE, VmState.ERROR))
START = PowerAction("start", "start_instance", TaskState.POWERING_ON, (VmState.STOPPED,))
SOFT_REBOOT = PowerAction("reboot", "reboot_instance", TaskState.REBOOTING, (VmState.ACTIVE,))
HARD_REBOOT = PowerAction(
    "reboot",
    "reboot_instance",
    TaskState.REBOOTING_HARD,
    (VmState.ACTIVE, VmState.STOPPED, VmState.ERROR, VmState.PAUSED, VmState.SUSPENDED),
    (None, TaskState.REBOOTING, TaskState.REBOOTING_HARD),
)
PAUSE = PowerAction("pause", "pause_instance", TaskState.PAUSING, (VmState.ACTIVE,))
UNPAUSE = PowerAction("unpause", "unpause_instance", TaskState.UNPAUSING, (VmState.PAUSED,))
SUSPEND = PowerAction(
    "suspend", "suspend_instance", TaskState.SUSPENDING, (VmState.ACTIVE, VmState.PAUSED)
)
RESUME = PowerAction("resume", "resume_instance", TaskState.RESUMING, (VmState.SUSPENDED,))


#: The tasks that start a guest that is not running.
STARTS = (
    TaskState.POWERING_ON,
    TaskState.REBOOTING_HARD,
    TaskState.UNPAUSING,
    TaskState.RESUMING,
    TaskState.RESTORING,
    TaskState.UNSHELVING,
)


async def refuse_while_a_stray_copy_may_run(
    pool: asyncpg.Pool, instance: Instance, name: str, down_time: float, margin: float
) -> None:
    """409 if the server's last move ended unfinished and the copy it may have started on
    its destination may still run there (see :mod:`services.conductor.moves.deadline`):
    starting the server too would run two copies."""
    async with pool.acquire() as conn:
        move = await moves.latest(conn, instance.uuid)
        if (
            move is None
            or move.status != MigrationStatus.ERROR
            or move.dest_compute_id is None
            or move.dest_compute_id == instance.compute_id
        ):
            return
        try:
            dest = await compute_nodes.host_state_by_id(conn, move.dest_compute_id, down_time)
        except ComputeNodeNotFound:
            return
        silent = await host_fencing.silent_for(conn, dest.service.id)
    if not host_fencing.stray_copy_may_run(
        dest.service, silent, margin=margin, ended_at=move.updated_at
    ):
        return
    host = dest.node.host
    raise ConflictingRequest(
        f"Cannot '{name}' instance {instance.uuid}: its {move.migration_type} to {host} "
        f"did not finish, and {host} has been down since, so the copy it may have started "
        f"there may still run. Bring the agent on {host} back (it stops that copy), wait "
        f"for its fence's lease to run out, or, if it has no armed fence, make sure the "
        f"host is off and force its service down (openstack compute service set --down "
        f"{host} keel-compute), then try again."
    )


async def too_old(
    pool: asyncpg.Pool, compute: ComputeAPI, name: str, method: str, down_time: float
) -> str:
    """Why the compute RPC cap does not allow action ``name`` (RPC ``method``): the
    services holding it down, or the operator's pin."""
    needed = SINCE[method]
    cap = await compute.client.cap()
    release = first_release_speaking("compute", needed) or 0
    async with pool.acquire() as conn:
        old = await services.older_than(conn, Binary.COMPUTE.value, release, down_time)
    if not old:
        return (
            f"the compute RPC version is pinned to {cap} (KEEL_UPGRADE_LEVELS__COMPUTE), "
            f"and '{name}' needs {needed}"
        )
    listing = ", ".join(_describe(service) for service in old)
    return (
        f"compute service(s) {listing} are too old: '{name}' needs compute RPC "
        f"{needed} (release {release_name(release)}), and the deployment's cap is {cap}. "
        "Upgrade those services first"
    )


def _describe(service: Service) -> str:
    return f"{service.host} (release {release_name(service.version)})"


async def _begin(
    pool: asyncpg.Pool, ctx: RequestContext, instance: Instance, action: PowerAction
) -> None:
    async def begin(conn: Connection) -> Instance | None:
        started = await instances.begin_task(
            conn,
            instance.uuid,
            action.task,
            vm_states=action.vm_states,
            from_tasks=action.from_tasks,
            claimed_in_error=True,
        )
        if started is not None:
            await instance_actions.start(conn, ctx, instance.uuid, action.name)
        return started

    # A recording whose commit lost its answer is withdrawn before the 503: it would
    # stand, answered 503 (and a soft delete or a restore no agent took is sent again by
    # the conductors).
    why = f"the connection to the database was lost as the {action.name} was recorded"
    if await publish.record(
        pool,
        begin,
        what=f"starting {action.name} of {instance.uuid}",
        withdraw=_withdrawing(ctx, instance.uuid, action, why),
        instance_uuid=instance.uuid,
        request_id=ctx.request_id,
    ):
        return
    if instance.vm_state == VmState.ERROR and not await _claimed(pool, instance):
        # A build that failed released the server's claim: a guest of it there (another
        # delivery's, whose result is on its way) would be powered on nobody's resources.
        raise ConflictingRequest(
            f"Cannot '{action.name}' instance {instance.uuid}: it holds no claim on its host "
            f"{instance.host} (its build never succeeded there), so nothing of it may be "
            "powered there. Delete it and create it again."
        )
    state = (
        f"task_state {instance.task_state}"
        if instance.task_state is not None and instance.vm_state in action.vm_states
        else f"vm_state {instance.vm_state}"
    )
    raise ConflictingRequest(
        f"Cannot '{action.name}' instance {instance.uuid} while it is in {state}"
    )


async def _claimed(pool: asyncpg.Pool, instance: Instance) -> bool:
    async with pool.acquire() as conn:
        return await allocations.held_on_node(conn, instance.uuid, instance.compute_id)


async def _withdraw(
    pool: asyncpg.Pool, ctx: RequestContext, instance_uuid: UUID, action: PowerAction, why: str
) -> bool:
    """Withdraw the request: clear its task and mark it withdrawn, if no agent took it (or,
    an agent of an older release, ended its task); False if one did (work taken)."""
    return await publish.withdraw(
        pool,
        _withdrawing(ctx, instance_uuid, action, why),
        what=f"withdrawing {action.name} of {instance_uuid}",
    )


def _withdrawing(
    ctx: RequestContext, instance_uuid: UUID, action: PowerAction, why: str
) -> Callable[[Connection], Awaitable[bool]]:
    """The transaction's work of :func:`_withdraw`."""

    async def withdraw(conn: Connection) -> bool:
        async def undo() -> bool:
            if await instances.finish_task(conn, instance_uuid, (action.task,)) is not None:
                return True
            # A delete's mark stands over this request's task: the mark stays (the delete
            # owns the server now), and the request, which no agent took, is withdrawn
            # all the same, so that its 503 means nothing happens, and a delete withdrawn
            # later gives no task back to it.
            return await instances.marked_for_delete(conn, instance_uuid)

        return await instance_actions.withdraw_untaken(
            conn, instance_uuid, ctx.request_id, why, undo
        )

    return withdraw


async def run_power_action(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
    action: PowerAction,
    reboot_type: RebootType = RebootType.SOFT,
    conductor: ConductorAPI | None = None,
) -> None:
    """Check, swap the task, cast; see the module docstring."""
    down_time = settings.service_down_time
    if not await compute.can_send(action.method):
        raise ConflictingRequest(
            f"Cannot '{action.name}' instance {instance.uuid}: "
            + await too_old(pool, compute, action.name, action.method, down_time)
            + "."
        )
    result = action.result or ResultAction(action.name)
    if conductor is not None and not await conductor.can_take_action_result(result):
        raise ConflictingRequest(
            f"Cannot '{action.name}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()}, and reporting '{action.name}' needs "
            f"{ACTION_RESULT_SINCE[result]}. Upgrade every keel-conductor first."
        )
    service = await host_service(pool, instance, down_time)
    if service is None:
        raise ConflictingRequest(
            f"Cannot '{action.name}' instance {instance.uuid} while it is in vm_state "
            f"{instance.vm_state} with no compute host"
        )
    if action.task in STARTS:
        await refuse_while_a_stray_copy_may_run(
            pool, instance, action.name, down_time, settings.fencing.margin
        )
    await _begin(pool, ctx, instance, action)

    async def cast() -> None:
        if action.method == "reboot_instance":
            await compute.reboot_instance(ctx, service.uuid, instance.uuid, reboot_type)
            return
        send = {
            "stop_instance": compute.stop_instance,
            "start_instance": compute.start_instance,
            "pause_instance": compute.pause_instance,
            "unpause_instance": compute.unpause_instance,
            "suspend_instance": compute.suspend_instance,
            "resume_instance": compute.resume_instance,
            "soft_delete_instance": compute.soft_delete_instance,
            "restore_instance": compute.restore_instance,
            "unshelve_instance": compute.unshelve_instance,
        }[action.method]
        await send(ctx, service.uuid, instance.uuid)

    try:
        failed = await publish.send(cast, what=f"{action.name} of server {instance.uuid}")
    except Unroutable:
        await _withdraw(
            pool, ctx, instance.uuid, action, f"no queue for compute service {service.uuid}"
        )
        raise ConflictingRequest(
            f"Cannot '{action.name}' instance {instance.uuid}: the compute service of host "
            f"{service.host} has no queue on the message bus; is its agent running?"
        ) from None
    if failed is not None:
        if await _withdraw(pool, ctx, instance.uuid, action, failed.message):
            raise ServiceUnavailable(
                f"The server was not changed: the message bus could not be reached "
                f"({failed.message}). Retry once RabbitMQ is available."
            )
        LOG.warning(
            "%s of server %s could not be confirmed sent (%s), but its agent already finished it",
            action.name,
            instance.uuid,
            failed.message,
            extra={"instance_uuid": str(instance.uuid)},
        )
        return
    LOG.info(
        "asked compute service %s on %s to %s server %s",
        service.uuid,
        service.host,
        action.name,
        instance.uuid,
        extra={"instance_uuid": str(instance.uuid)},
    )


def state_conflict(instance: Instance, action: str) -> ConflictingRequest:
    """The 409 of an action the server's task or vm state does not allow, as Nova words it."""
    state = (
        f"task_state {instance.task_state}"
        if instance.task_state is not None
        else f"vm_state {instance.vm_state}"
    )
    return ConflictingRequest(f"Cannot '{action}' instance {instance.uuid} while it is in {state}")
