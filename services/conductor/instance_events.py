"""What agents report about instances, and what they ask before they build.

Reports arrive as casts, delivered at least once and possibly twice at the same time, so
each handler is a compare-and-swap on the state it expects: a build result for an
instance that is no longer building/spawning is a repeat (or lost a race with a delete or
the build deadline) and changes nothing; releasing claims and soft-deleting are
idempotent.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.conductor import shelving
from services.conductor.builds.task import CREATE_ACTION
from services.conductor.rpcapi import (
    BuildCheck,
    BuildVerdict,
    CheckBuild,
    InstanceActionResult,
    InstanceBuildResult,
    PowerAction,
    RequestTaken,
    TakeRequest,
)
from shared import copy_tokens
from shared.db import (
    allocations,
    compute_nodes,
    fixed_ips,
    instance_actions,
    instances,
    placement,
    rebuilds,
    shelves,
    snapshots,
)
from shared.db.pool import Connection
from shared.objects.instance import Instance
from shared.objects.states import SNAPSHOT_TASKS, PowerState, TaskState, VmState
from shared.versions import COPY_TOKENS_VERSION

LOG = logging.getLogger(__name__)

DELETE_ACTION = "delete"


async def _release_if_deleted(conn: Connection, instance_uuid: UUID) -> bool:
    """If the instance is gone, make sure its claims are too; True if it was gone."""
    instance = await instances.find(conn, instance_uuid)
    if instance is not None and instance.deleted_at is None:
        return False
    released = await allocations.release_instance(conn, instance_uuid)
    if released:
        LOG.info(
            "instance %s was deleted during its build; released %d claim(s)",
            instance_uuid,
            len(released),
            extra={"instance_uuid": str(instance_uuid), "decision": "claim_released"},
        )
    return True


async def _built_after_its_deadline(conn: Connection, instance_uuid: UUID) -> bool:
    """A guest finished building after the build deadline put its server in ERROR: it runs,
    so the server is ACTIVE again, and its claim (released by the deadline) is recorded
    again, whatever room is left, since the guest uses it. False if that is not the case.
    """
    row = await conn.fetchrow(
        """UPDATE instances SET vm_state = $2, power_state = $3, launched_at = now(),
                  fault = NULL, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $4 AND task_state IS NULL
              AND launched_at IS NULL AND compute_id IS NOT NULL
        RETURNING *""",
        instance_uuid,
        VmState.ACTIVE.value,
        int(PowerState.RUNNING),
        VmState.ERROR.value,
    )
    if row is None:
        return False
    instance = Instance.from_row(row)
    assert instance.compute_id is not None
    await allocations.claim(conn, instance.compute_id, instance.uuid, instance.flavor, force=True)
    LOG.warning(
        "instance %s finished building on host %s after its build deadline: it runs, so it "
        "is ACTIVE again and its claim there recorded again",
        instance_uuid,
        instance.host,
        extra={"instance_uuid": str(instance_uuid), "decision": "built_after_deadline"},
    )
    return True


async def _built_under_another_task(conn: Connection, req: InstanceBuildResult) -> bool:
    """A guest finished building after its server was put in ERROR, and another task (an
    evacuation, say) runs on the server now: that task settles the server's state, but
    the guest runs on the server's node and uses its resources there, so its claim is
    recorded again (released when the copy goes: a move's source confirmed, a delete).
    False if that is not the case. The server's row is locked: a move that links the
    server elsewhere, or a delete, waits for this or is seen by it."""
    row = await conn.fetchrow(
        "SELECT * FROM instances WHERE uuid = $1 FOR UPDATE", req.instance_uuid
    )
    if row is None:
        return False
    instance = Instance.from_row(row)
    if (
        instance.deleted_at is not None
        or instance.vm_state != VmState.ERROR
        or instance.launched_at is not None
        or instance.task_state is None
        or instance.task_state == TaskState.DELETING
        or instance.compute_id is None
        or (req.built is not None and not copy_tokens.is_current(instance, req.built.token))
    ):
        return False
    await allocations.claim(conn, instance.compute_id, instance.uuid, instance.flavor, force=True)
    LOG.warning(
        "instance %s finished building on host %s after it was put in ERROR, while its "
        "task is %s: its guest runs there, so its claim there is recorded again; the "
        "server stays in ERROR",
        req.instance_uuid,
        instance.host,
        instance.task_state,
        extra={"instance_uuid": str(req.instance_uuid), "decision": "built_under_a_task"},
    )
    return True


async def record_build_result(pool: asyncpg.Pool, req: InstanceBuildResult) -> Instance | None:
    """ACTIVE on success; on failure ERROR with the agent's message and claims released.

    The instance as this result left it; ``None`` when it changed nothing (a repeat, a
    result that lost its race with a delete or the build deadline, or one for a copy that
    is not the server's current one: its copy token differs).
    """
    extra = {"instance_uuid": str(req.instance_uuid)}
    async with pool.acquire() as conn:
        current = await instances.find(conn, req.instance_uuid)
    if req.built is not None and not _for_the_current_copy(current, req):
        return None
    if current is not None and current.vm_state == VmState.SHELVED_OFFLOADED:
        # The build of an unshelve: it ends in ACTIVE or back in SHELVED_OFFLOADED.
        await shelving.record_unshelve_build(pool, req)
        return None
    if req.success:
        async with pool.acquire() as conn:
            # One statement: the server ACTIVE and its create action closed, or neither.
            instance = await instances.set_active(conn, req.instance_uuid, closing=CREATE_ACTION)
        if instance is not None:
            LOG.info(
                "instance %s is ACTIVE on host %s",
                req.instance_uuid,
                instance.host,
                extra={**extra, "decision": "build_succeeded"},
            )
            return instance
    async with pool.acquire() as conn, conn.transaction():
        if req.success:
            instance = None
        else:
            message = req.message or f"Build of instance {req.instance_uuid} failed."
            instance = await instances.set_build_failed(conn, req.instance_uuid, message=message)
        if instance is None:
            if req.success and (
                await _built_after_its_deadline(conn, req.instance_uuid)
                or await _built_under_another_task(conn, req)
            ):
                return None
            if not await _release_if_deleted(conn, req.instance_uuid):
                LOG.info(
                    "ignoring a build result for instance %s: it is no longer spawning "
                    "(already handled)",
                    req.instance_uuid,
                    extra=extra,
                )
            return None
        released = await allocations.release_instance(conn, req.instance_uuid)
        await instance_actions.finish(conn, req.instance_uuid, CREATE_ACTION, message)
    LOG.info(
        "build of instance %s failed on host %s: %s; released %d claim(s)",
        req.instance_uuid,
        instance.host,
        message,
        len(released),
        extra={**extra, "decision": "build_failed"},
    )
    return instance


def _for_the_current_copy(instance: Instance | None, req: InstanceBuildResult) -> bool:
    """Whether the result is for the copy ``instance`` (as just read) holds current."""
    assert req.built is not None
    if instance is None or instance.deleted_at is not None:
        return True  # what a deleted server's result does is decided below
    if copy_tokens.is_current(instance, req.built.token):
        return True
    if instance.task_state == TaskState.DELETING and instance.copy_token == req.built.token:
        # The delete may yet be withdrawn: the server's guest runs, and is recorded so.
        return True
    LOG.warning(
        "ignoring a build result for server %s: it is for %s, and the server's current copy "
        "carries %s",
        req.instance_uuid,
        copy_tokens.describe(req.built.token),
        copy_tokens.describe(instance.copy_token),
        extra={"instance_uuid": str(req.instance_uuid), "decision": "stale_build_result"},
    )
    return False


async def record_deleted(pool: asyncpg.Pool, instance_uuid: UUID) -> None:
    """Release the instance's claims and addresses, soft-delete it, close its delete
    action, kill the image of a snapshot it was taking, delete its shelved image."""
    async with pool.acquire() as conn, conn.transaction():
        released = await allocations.release_instance(conn, instance_uuid)
        deleted = await instances.soft_delete(conn, instance_uuid)
        await fixed_ips.release(conn, instance_uuid)
        # A snapshot the delete cut short (its agent will not take it now) leaves no image.
        await snapshots.kill_unfinished(conn, instance_uuid)
        await shelves.delete_image_of_deleted(conn, instance_uuid)
        await instance_actions.finish(conn, instance_uuid, DELETE_ACTION)
    if deleted or released:
        LOG.info(
            "instance %s deleted; released %d claim(s)",
            instance_uuid,
            len(released),
            extra={"instance_uuid": str(instance_uuid), "decision": "instance_deleted"},
        )
    else:
        LOG.debug("instance %s was already deleted", instance_uuid)


async def _agent_older_than(pool: asyncpg.Pool, node: compute_nodes.NodeRef, version: int) -> bool:
    """Whether the agent of ``node`` runs a release before ``version`` (asked only on the
    rare paths that depend on it, not on every build check)."""
    async with pool.acquire() as conn:
        found = await conn.fetchval("SELECT version FROM services WHERE id = $1", node.service_id)
    return (found or 0) < version


async def check_build(pool: asyncpg.Pool, req: CheckBuild) -> BuildCheck:
    """Whether the agent of node ``req.compute_node_uuid`` should build the instance."""
    async with pool.acquire() as conn:
        node, instance = await compute_nodes.with_instance(
            conn, req.compute_node_uuid, req.instance_uuid
        )
        if instance is None or instance.deleted_at is not None:
            return BuildCheck(verdict=BuildVerdict.ABANDON, reason="the instance was deleted")
        if instance.compute_id is not None:
            # Linked by id: the asking node is live, so comparing ids is the whole check.
            here = instance.compute_id == node.id
        else:
            placed_on = await placement.node_of(conn, instance)
            here = placed_on is not None and placed_on.id == node.id
    if not here:
        where = f"{instance.host}/{instance.node}" if instance.host else "no host yet"
        return BuildCheck(
            verdict=BuildVerdict.LEAVE, reason=f"the instance is placed elsewhere ({where})"
        )
    if instance.vm_state == VmState.BUILDING:
        if instance.task_state == TaskState.SPAWNING:
            return BuildCheck(verdict=BuildVerdict.BUILD, reason="the instance is spawning here")
        return BuildCheck(
            verdict=BuildVerdict.ABANDON,
            reason=f"its task is now {instance.task_state or 'none'}, not spawning",
        )
    if instance.vm_state == VmState.SHELVED_OFFLOADED:
        if req.guest is not None and not copy_tokens.is_current(instance, req.guest.token):
            # A copy an offload left here (its agent was away): not the server's, whose
            # disk is in its shelved image. It goes; the unshelve builds the server anew.
            return BuildCheck(
                verdict=BuildVerdict.ABANDON,
                reason=f"the guest here is {copy_tokens.describe(req.guest.token)}, left by "
                "an offload: not the server's copy",
            )
        if instance.task_state == TaskState.SPAWNING:
            return BuildCheck(
                verdict=BuildVerdict.BUILD, reason="the instance is being unshelved here"
            )
        return BuildCheck(
            verdict=BuildVerdict.ABANDON,
            reason=f"its unshelve ended (task {instance.task_state or 'none'}, not spawning)",
        )
    if instance.vm_state == VmState.ERROR and instance.launched_at is None:
        if req.guest is not None and copy_tokens.is_current(instance, req.guest.token):
            # Another delivery built it (or this agent did, and died before reporting):
            # it is the server's copy, never removed; its success makes the server ACTIVE.
            return BuildCheck(
                verdict=BuildVerdict.BUILD,
                reason="the build was put in ERROR, but this guest is the server's current copy",
            )
        if req.guest is None and await _agent_older_than(pool, node, COPY_TOKENS_VERSION):
            # An agent of a release before copy tokens cannot say whether a guest it has
            # is the server's copy (another delivery's, whose success is on its way and
            # makes the server ACTIVE again): such a guest is left, never removed here.
            return BuildCheck(
                verdict=BuildVerdict.LEAVE,
                reason="the build already failed or ran out of time; a guest of it here "
                "is left for its own result (this agent's release cannot say which "
                "copy it is)",
            )
        return BuildCheck(
            verdict=BuildVerdict.ABANDON,
            reason="the build already failed or ran out of time",
        )
    return BuildCheck(
        verdict=BuildVerdict.LEAVE, reason=f"the instance is already {instance.vm_state} here"
    )


#: What each power action ends in: the tasks it may be in, and the states it leads to.
_POWER_OUTCOMES: dict[PowerAction, tuple[tuple[TaskState, ...], VmState, PowerState]] = {
    PowerAction.STOP: ((TaskState.POWERING_OFF,), VmState.STOPPED, PowerState.SHUTDOWN),
    PowerAction.START: ((TaskState.POWERING_ON,), VmState.ACTIVE, PowerState.RUNNING),
    PowerAction.REBOOT: (
        (TaskState.REBOOTING, TaskState.REBOOTING_HARD),
        VmState.ACTIVE,
        PowerState.RUNNING,
    ),
    PowerAction.PAUSE: ((TaskState.PAUSING,), VmState.PAUSED, PowerState.PAUSED),
    PowerAction.UNPAUSE: ((TaskState.UNPAUSING,), VmState.ACTIVE, PowerState.RUNNING),
    # As Nova with libvirt shows a suspended guest: its domain is saved and shut off.
    PowerAction.SUSPEND: ((TaskState.SUSPENDING,), VmState.SUSPENDED, PowerState.SHUTDOWN),
    PowerAction.RESUME: ((TaskState.RESUMING,), VmState.ACTIVE, PowerState.RUNNING),
    # A DELETE with soft delete on: the guest is off and kept; a restore runs it again.
    PowerAction.SOFT_DELETE: (
        (TaskState.SOFT_DELETING,),
        VmState.SOFT_DELETED,
        PowerState.SHUTDOWN,
    ),
    PowerAction.RESTORE: ((TaskState.RESTORING,), VmState.ACTIVE, PowerState.RUNNING),
}

#: The instance action each result closes, where it is not the action's own name: a
#: soft delete is recorded as the ``delete`` it is, as Nova records it.
_ACTION_RECORDS: dict[PowerAction, str] = {PowerAction.SOFT_DELETE: DELETE_ACTION}


async def take_request(pool: asyncpg.Pool, req: TakeRequest) -> RequestTaken:
    """An agent takes keel-api's request before acting on it: from then on keel-api cannot
    withdraw it; if keel-api withdrew it first, the agent is told not to act.

    Idempotent (an agent handling a message twice takes it twice), and serialised with
    the withdrawal on the request's record (``instance_actions.take``).
    """
    async with pool.acquire() as conn:
        if req.task is not None and req.node_uuid is not None:
            # A snapshot's request is current through all its steps: delivered again
            # after its agent was cut off mid-upload, it is taken and written again.
            steps = [t.value for t in SNAPSHOT_TASKS] if req.task in SNAPSHOT_TASKS else req.task
            proceed = await instance_actions.take_current(
                conn, req.instance_uuid, req.request_id, steps, req.node_uuid
            )
            if not proceed:
                LOG.info(
                    "request %s on instance %s is not taken: its %s is no longer under way "
                    "on node %s (ended, withdrawn, or the instance is elsewhere)",
                    req.request_id,
                    req.instance_uuid,
                    req.task,
                    req.node_uuid,
                    extra={
                        "instance_uuid": str(req.instance_uuid),
                        "decision": "request_not_current",
                    },
                )
                return RequestTaken(proceed=False)
        else:
            proceed = await instance_actions.take(conn, req.instance_uuid, req.request_id)
    if not proceed:
        LOG.warning(
            "request %s on instance %s was withdrawn (keel-api answered 503, or the "
            "conductor's reclaim could not confirm it was sent): its agent will not act on it",
            req.request_id,
            req.instance_uuid,
            extra={"instance_uuid": str(req.instance_uuid), "decision": "request_withdrawn"},
        )
    return RequestTaken(proceed=proceed)


async def record_action_result(pool: asyncpg.Pool, req: InstanceActionResult) -> None:
    """End the instance's stop, start, reboot, pause, unpause, suspend, resume, soft delete
    or restore task as the agent reports it went.

    A compare-and-swap on the task the action set: a repeated report, or one for an
    instance deleted meanwhile, changes nothing. A failure leaves the instance as it was
    (its vm state unchanged), with the reason on its action record.
    """
    if req.action is PowerAction.REBUILD:
        await _record_rebuild_result(pool, req)
        return
    if req.action is PowerAction.SNAPSHOT:
        await _record_snapshot_result(pool, req)
        return
    tasks, vm_state, power_state = _POWER_OUTCOMES[req.action]
    extra = {"instance_uuid": str(req.instance_uuid)}
    async with pool.acquire() as conn, conn.transaction():
        if req.success:
            done = await instances.finish_task(
                conn, req.instance_uuid, tasks, vm_state=vm_state, power_state=power_state
            )
        else:
            done = await instances.finish_task(conn, req.instance_uuid, tasks)
        if done is None:
            LOG.info(
                "ignoring the %s result for instance %s: it is no longer in that task "
                "(already handled)",
                req.action,
                req.instance_uuid,
                extra=extra,
            )
            return
        record = _ACTION_RECORDS.get(req.action, req.action.value)
        await instance_actions.finish(
            conn, req.instance_uuid, record, None if req.success else req.message
        )
    if req.success:
        LOG.info("instance %s: %s done", req.instance_uuid, req.action, extra=extra)
    else:
        LOG.warning(
            "instance %s: %s failed: %s", req.instance_uuid, req.action, req.message, extra=extra
        )


async def _record_rebuild_result(pool: asyncpg.Pool, req: InstanceActionResult) -> None:
    """End a rebuild as the agent reports it went: a SHUTOFF server stays SHUTOFF, any
    other becomes ACTIVE; a failed rebuild is ERROR (its old guest is gone), with the
    reason as its fault. A compare-and-swap on the task: repeated, it changes nothing."""
    extra = {"instance_uuid": str(req.instance_uuid)}
    async with pool.acquire() as conn, conn.transaction():
        done = await rebuilds.end(conn, req.instance_uuid, success=req.success, message=req.message)
        if done is None:
            LOG.info(
                "ignoring the rebuild result for instance %s: it is no longer rebuilding "
                "(already handled)",
                req.instance_uuid,
                extra=extra,
            )
            return
        await instance_actions.finish(
            conn, req.instance_uuid, req.action.value, None if req.success else req.message
        )
    if req.success:
        LOG.info(
            "instance %s rebuilt from image %s: %s",
            req.instance_uuid,
            done.image_ref,
            done.vm_state,
            extra={**extra, "decision": "rebuilt"},
        )
    else:
        LOG.warning(
            "instance %s is in ERROR: its rebuild failed: %s",
            req.instance_uuid,
            req.message,
            extra={**extra, "decision": "rebuild_failed"},
        )


#: The instance actions a snapshot is recorded as (Nova's names: a snapshot, a backup).
SNAPSHOT_ACTION = "createImage"
BACKUP_ACTION = "createBackup"


async def _record_snapshot_result(pool: asyncpg.Pool, req: InstanceActionResult) -> None:
    """End a snapshot as the agent reports it went: the server's task cleared (its vm
    state as it was); a failure kills the image it was writing. A compare-and-swap on
    the task: repeated, it changes nothing."""
    extra = {"instance_uuid": str(req.instance_uuid)}
    async with pool.acquire() as conn, conn.transaction():
        done = await snapshots.end(conn, req.instance_uuid)
        killed = [] if req.success else await snapshots.kill_unfinished(conn, req.instance_uuid)
        if done is None:
            LOG.info(
                "ignoring the snapshot result for instance %s: it is no longer taking a "
                "snapshot (already handled)%s",
                req.instance_uuid,
                f"; killed its unfinished image(s) {', '.join(map(str, killed))}" if killed else "",
                extra=extra,
            )
            return
        # The server had one snapshot task: whichever of the two actions started it.
        for action in (SNAPSHOT_ACTION, BACKUP_ACTION):
            await instance_actions.finish(
                conn, req.instance_uuid, action, None if req.success else req.message
            )
    if req.success:
        LOG.info(
            "instance %s: snapshot done",
            req.instance_uuid,
            extra={**extra, "decision": "snapshot_done"},
        )
    else:
        LOG.warning(
            "instance %s: snapshot failed (%s); killed its image(s) %s",
            req.instance_uuid,
            req.message,
            ", ".join(map(str, killed)) or "(none left)",
            extra={**extra, "decision": "snapshot_failed"},
        )
