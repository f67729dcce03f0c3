"""The ends of a cold migration: the destination's result, then confirm or revert.

The move itself (choosing a destination, shutting the source guest down, building the
copy there) is :class:`~services.conductor.tasks.move.MoveTask`. Then:

* ``move_result`` (cast, from the destination's agent): on success one transaction
  moves the instance's compute link to the destination, leaves it ``resized`` (status
  VERIFY_RESIZE) and marks the record ``finished``. Both claims stay: the instance's on
  the source, the migration's on the destination. On failure the record is ``failed``,
  the migration's claim released and the instance in ERROR on its source.
* ``confirm_migration`` (keel-api moved the record to ``confirming``): the source's
  agent removes its copy; then the record is ``confirmed``, the instance's claim on the
  source is released and the migration's claim on the destination becomes the
  instance's own.
* ``revert_migration`` (record ``reverting``): the destination's agent removes its copy;
  the instance is linked to its source again and the migration's claim released; the
  source's agent starts the guest if it was running; the record is ``reverted``.
* ``copy_removed`` (call, from an agent's guest report): a copy that a confirmed or
  reverted migration left was removed by its agent, which finishes the step if the
  conductor could not (its agent was away).

Every step is a compare-and-swap on the record's status, so twins and repeats find the
record moved on and do nothing; the agents' operations are idempotent.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import CopyRemoved, MoveResult
from services.conductor.tasks.move import MIGRATION
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves
from shared.exceptions import Conflict, KeelError
from shared.faults import FaultPoints
from shared.objects.instance import Instance
from shared.objects.migration import Migration, MigrationStatus
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.settlement import is_transient

LOG = logging.getLogger(__name__)

CONFIRM_ACTION = "confirmResize"
REVERT_ACTION = "revertResize"


def _extra(migration: Migration) -> dict[str, str]:
    return {"instance_uuid": str(migration.instance_uuid), "migration_uuid": str(migration.uuid)}


def _was_running(instance: Instance) -> bool:
    """Whether the migrated instance runs (its VERIFY_RESIZE copy is powered on)."""
    return instance.power_state != PowerState.SHUTDOWN


async def record_move_result(
    pool: asyncpg.Pool, compute: ComputeAPI, req: MoveResult, down_time: float
) -> None:
    async with pool.acquire() as conn:
        migration = await moves.get(conn, req.migration_uuid)
    if migration.status != MigrationStatus.PRE_MIGRATING:
        LOG.info(
            "ignoring a result for migration %s: it is %s (already handled)",
            migration.uuid,
            migration.status,
            extra=_extra(migration),
        )
        return
    if not req.success:
        await _build_failed(pool, migration, req.message or "the build failed")
    elif await _built(pool, migration):
        await _remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)


async def _built(pool: asyncpg.Pool, migration: Migration) -> bool:
    """Finish the build step; True if the instance was deleted meanwhile."""
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        dest = await compute_nodes.get_by_id(conn, migration.dest_compute_id)
        instance = await instances.find(conn, migration.instance_uuid)
        if instance is None or instance.deleted_at is not None:
            ended = await moves.swap_status(
                conn,
                migration.uuid,
                expected=[MigrationStatus.PRE_MIGRATING],
                new=MigrationStatus.ERROR,
            )
            if ended is not None:
                await allocations.release_consumer(conn, migration.uuid)
            return ended is not None
        stopped = instance.vm_state == VmState.STOPPED
        moved = await instances.move_to(
            conn,
            instance.uuid,
            task=TaskState.RESIZE_MIGRATING,
            node=dest,
            vm_state=VmState.RESIZED,
            power_state=PowerState.SHUTDOWN if stopped else PowerState.RUNNING,
        )
        finished = None
        if moved is not None:
            finished = await moves.swap_status(
                conn,
                migration.uuid,
                expected=[MigrationStatus.PRE_MIGRATING],
                new=MigrationStatus.FINISHED,
            )
            await instance_actions.finish(conn, instance.uuid, MIGRATION.action)
    if finished is None:
        LOG.info("migration %s was already finished", migration.uuid, extra=_extra(migration))
        return False
    LOG.info(
        "instance %s was migrated from %s to %s (migration %s is finished): it waits for "
        "confirm or revert, holding claims on both hosts",
        migration.instance_uuid,
        migration.source_compute,
        dest.host,
        migration.uuid,
        extra={**_extra(migration), "decision": "migration_finished"},
    )
    return False


async def _build_failed(pool: asyncpg.Pool, migration: Migration, message: str) -> None:
    fault = f"Migration to {migration.dest_compute} failed: {message}"
    async with pool.acquire() as conn, conn.transaction():
        ended = await moves.swap_status(
            conn,
            migration.uuid,
            expected=[MigrationStatus.PRE_MIGRATING],
            new=MigrationStatus.FAILED,
        )
        if ended is None:
            return
        await allocations.release_consumer(conn, migration.uuid)
        await instances.fail_task(
            conn, migration.instance_uuid, TaskState.RESIZE_MIGRATING, message=fault
        )
        await instance_actions.finish(conn, migration.instance_uuid, MIGRATION.action, fault)
    LOG.warning(
        "migration %s failed on %s: %s; its claim there is released and instance %s stays "
        "on %s (shut down), in ERROR",
        migration.uuid,
        migration.dest_compute,
        message,
        migration.instance_uuid,
        migration.source_compute,
        extra={**_extra(migration), "decision": "migration_failed"},
    )


async def _remove_copy(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    migration: Migration,
    node_id: int | None,
    down_time: float,
) -> bool:
    """Ask the agent of ``node_id`` to remove its copy; False if that agent is down."""
    assert node_id is not None
    async with pool.acquire() as conn:
        host = await compute_nodes.host_state_by_id(conn, node_id, down_time)
    if not host.service.is_up:
        LOG.warning(
            "cannot remove the copy of instance %s on %s for migration %s now: its compute "
            "service is down; its agent removes it when it reports its guests again",
            migration.instance_uuid,
            host.node.host,
            migration.uuid,
            extra=_extra(migration),
        )
        return False
    await compute.remove_moved_guest(
        RequestContext.internal(), host.service.uuid, migration.instance_uuid, migration.uuid
    )
    return True


async def confirm(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    migration_uuid: UUID,
    down_time: float,
    *,
    faults: FaultPoints | None = None,
) -> None:
    """Remove the source's copy, then make the destination the instance's only home."""
    async with pool.acquire() as conn:
        migration = await moves.get(conn, migration_uuid)
    if migration.status != MigrationStatus.CONFIRMING:
        LOG.info(
            "not confirming migration %s: it is %s",
            migration.uuid,
            migration.status,
            extra=_extra(migration),
        )
        return
    try:
        removed = await _remove_copy(
            pool, compute, migration, migration.source_compute_id, down_time
        )
    except KeelError as exc:
        if is_transient(exc):
            raise
        await _step_failed(pool, migration, CONFIRM_ACTION, exc.message)
        return
    if removed:
        (faults or FaultPoints()).reached("conductor.confirm.after_remove")
        await finish_confirm(pool, migration)


async def finish_confirm(pool: asyncpg.Pool, migration: Migration) -> None:
    """The source's copy is gone: ``confirming`` → ``confirmed``, claims settled."""
    assert migration.source_compute_id is not None
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        confirmed = await moves.swap_status(
            conn,
            migration.uuid,
            expected=[MigrationStatus.CONFIRMING],
            new=MigrationStatus.CONFIRMED,
        )
        if confirmed is None:
            LOG.info("migration %s was already confirmed", migration.uuid, extra=_extra(migration))
            return
        await allocations.release(conn, migration.instance_uuid, migration.source_compute_id)
        await allocations.hand_over(
            conn,
            migration.dest_compute_id,
            from_consumer=migration.uuid,
            to_consumer=migration.instance_uuid,
        )
        instance = await instances.find(conn, migration.instance_uuid)
        if instance is not None and instance.deleted_at is None:
            running = _was_running(instance)
            await instances.finish_task(
                conn,
                instance.uuid,
                (TaskState.RESIZE_CONFIRMING,),
                vm_state=VmState.ACTIVE if running else VmState.STOPPED,
            )
            await instance_actions.finish(conn, instance.uuid, CONFIRM_ACTION)
    LOG.info(
        "migration %s of instance %s is confirmed: its copy on %s is removed and the claim "
        "there released; it lives on %s",
        migration.uuid,
        migration.instance_uuid,
        migration.source_compute,
        migration.dest_compute,
        extra={**_extra(migration), "decision": "migration_confirmed"},
    )


async def revert(
    pool: asyncpg.Pool, compute: ComputeAPI, migration_uuid: UUID, down_time: float
) -> None:
    """Remove the destination's copy, then return the instance to its source."""
    async with pool.acquire() as conn:
        migration = await moves.get(conn, migration_uuid)
    if migration.status != MigrationStatus.REVERTING:
        LOG.info(
            "not reverting migration %s: it is %s",
            migration.uuid,
            migration.status,
            extra=_extra(migration),
        )
        return
    try:
        removed = await _remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)
    except KeelError as exc:
        if is_transient(exc):
            raise
        await _step_failed(pool, migration, REVERT_ACTION, exc.message)
        return
    if removed:
        await finish_revert(pool, compute, migration, down_time)


async def finish_revert(
    pool: asyncpg.Pool, compute: ComputeAPI, migration: Migration, down_time: float
) -> None:
    """The destination's copy is gone: back to the source, then ``reverted``.

    Three steps, each converging when repeated: link the instance to its source and
    release the migration's claim (the task stays ``resize_reverting``); have the source
    agent start the guest if it was running; end the task and the record.
    """
    assert migration.source_compute_id is not None
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        current = await moves.get(conn, migration.uuid)
        if current.status != MigrationStatus.REVERTING:
            LOG.info("migration %s was already reverted", migration.uuid, extra=_extra(migration))
            return
        source = await compute_nodes.host_state_by_id(conn, migration.source_compute_id, down_time)
        await allocations.release(conn, migration.uuid, migration.dest_compute_id)
        instance = await instances.relink(
            conn, migration.instance_uuid, task=TaskState.RESIZE_REVERTING, node=source.node
        )
        if instance is None:
            await moves.swap_status(
                conn,
                migration.uuid,
                expected=[MigrationStatus.REVERTING],
                new=MigrationStatus.REVERTED,
            )
            LOG.info(
                "migration %s is reverted without its instance (deleted, or its task ended)",
                migration.uuid,
                extra=_extra(migration),
            )
            return
    running = _was_running(instance)
    try:
        await compute.finish_revert(
            RequestContext.internal(),
            source.service.uuid,
            migration.instance_uuid,
            migration.uuid,
            power_on=running,
        )
    except KeelError as exc:
        if is_transient(exc):
            raise
        await _step_failed(pool, migration, REVERT_ACTION, exc.message)
        return
    async with pool.acquire() as conn, conn.transaction():
        reverted = await moves.swap_status(
            conn,
            migration.uuid,
            expected=[MigrationStatus.REVERTING],
            new=MigrationStatus.REVERTED,
        )
        if reverted is None:
            return
        await instances.finish_task(
            conn,
            migration.instance_uuid,
            (TaskState.RESIZE_REVERTING,),
            vm_state=VmState.ACTIVE if running else VmState.STOPPED,
            power_state=PowerState.RUNNING if running else PowerState.SHUTDOWN,
        )
        await instance_actions.finish(conn, migration.instance_uuid, REVERT_ACTION)
    LOG.info(
        "migration %s of instance %s is reverted: its copy on %s is removed and the claim "
        "there released; it lives on %s again",
        migration.uuid,
        migration.instance_uuid,
        migration.dest_compute,
        migration.source_compute,
        extra={**_extra(migration), "decision": "migration_reverted"},
    )


async def _step_failed(pool: asyncpg.Pool, migration: Migration, action: str, message: str) -> None:
    """An agent could not do its part of a confirm or revert: record and fault, ERROR.

    The record goes to ``error`` and the instance to ERROR with the agent's message;
    nothing is removed, so an operator can see both copies and decide.
    """
    confirming = action == CONFIRM_ACTION
    status = MigrationStatus.CONFIRMING if confirming else MigrationStatus.REVERTING
    task = TaskState.RESIZE_CONFIRMING if confirming else TaskState.RESIZE_REVERTING
    fault = f"{action} of migration {migration.uuid} failed: {message}"
    async with pool.acquire() as conn, conn.transaction():
        ended = await moves.swap_status(
            conn, migration.uuid, expected=[status], new=MigrationStatus.ERROR
        )
        if ended is None:
            return
        await instances.fail_task(conn, migration.instance_uuid, task, message=fault)
        await instance_actions.finish(conn, migration.instance_uuid, action, fault)
    LOG.error(
        "%s; instance %s is in ERROR and its claims are kept for an operator to decide",
        fault,
        migration.instance_uuid,
        extra={**_extra(migration), "decision": "migration_error"},
    )


async def copy_removed(
    pool: asyncpg.Pool, compute: ComputeAPI, req: CopyRemoved, down_time: float
) -> None:
    """An agent removed the copy a confirmed or reverted migration left on its host."""
    async with pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        migration = await moves.get(conn, req.migration_uuid)
    if node.id not in (migration.source_compute_id, migration.dest_compute_id):
        raise Conflict(
            f"migration {migration.uuid} is neither from nor to node {node.uuid}; refusing "
            "a copy removal reported by that node"
        )
    if migration.status == MigrationStatus.CONFIRMING and node.id == migration.source_compute_id:
        await finish_confirm(pool, migration)
    elif migration.status == MigrationStatus.REVERTING and node.id == migration.dest_compute_id:
        await finish_revert(pool, compute, migration, down_time)
    else:
        LOG.info(
            "host %s removed its copy of instance %s for migration %s, which is %s: nothing "
            "left to do",
            node.host,
            migration.instance_uuid,
            migration.uuid,
            migration.status,
            extra=_extra(migration),
        )
