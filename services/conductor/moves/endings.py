"""The end of a move: a cold migration confirmed or reverted, an evacuation confirmed.

The move itself is :class:`~services.conductor.moves.task.MoveTask`, the destination's
result :mod:`services.conductor.moves.arrival`. Then:

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

* ``evacuation_confirmed`` (call, from an evacuation's source agent once its copy is
  gone): the record becomes ``completed`` and the instance's claim on the source is
  released (unless the instance lives on that host again).

Every step is a compare-and-swap on the record's status, so twins and repeats find the
record moved on and do nothing; the agents' operations are idempotent.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.moves.arrival import extra as _extra
from services.conductor.moves.arrival import remove_copy
from services.conductor.rpcapi import CopyRemoved, EvacuationConfirmed
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves
from shared.db.pool import Connection
from shared.exceptions import Conflict, KeelError
from shared.faults import FaultPoints
from shared.objects.compute_node import HostState
from shared.objects.instance import Instance
from shared.objects.migration import CONFIRM_ACTION, REVERT_ACTION, Migration, MigrationStatus
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.settlement import is_transient

LOG = logging.getLogger(__name__)


def _was_running(instance: Instance) -> bool:
    """Whether the migrated instance runs (its VERIFY_RESIZE copy is powered on)."""
    return instance.power_state != PowerState.SHUTDOWN


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
    if migration.in_place:
        # A resize on its own host left one copy, the server: nothing to remove.
        await finish_confirm(pool, migration)
        return
    try:
        removed = await remove_copy(
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


async def _claims_to_destination(conn: Connection, migration: Migration) -> None:
    """The server lives on the destination for good: its claim on the source is released
    and the migration's claim on the destination becomes its own."""
    assert migration.source_compute_id is not None
    assert migration.dest_compute_id is not None
    await allocations.release(conn, migration.instance_uuid, migration.source_compute_id)
    await allocations.hand_over(
        conn,
        migration.dest_compute_id,
        from_consumer=migration.uuid,
        to_consumer=migration.instance_uuid,
    )


async def finish_confirm(pool: asyncpg.Pool, migration: Migration) -> None:
    """The source's copy is gone: ``confirming`` → ``confirmed``, claims settled."""
    assert migration.source_compute_id is not None
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        await moves.lock(conn, migration.uuid)
        confirmed = await moves.swap_status(
            conn,
            migration.uuid,
            expected=[MigrationStatus.CONFIRMING],
            new=MigrationStatus.CONFIRMED,
        )
        if confirmed is None:
            LOG.info("migration %s was already confirmed", migration.uuid, extra=_extra(migration))
            return
        await _claims_to_destination(conn, migration)
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
    if migration.in_place:
        # A resize on its own host: its one copy is given its old flavor back instead.
        await finish_revert(pool, compute, migration, down_time)
        return
    if await _link_back(pool, migration, down_time) is None:
        return
    try:
        removed = await remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)
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
    release the migration's claim (the task stays ``resize_reverting``; :func:`revert`
    took this step already, before the destination removed its copy); have the source
    agent start the guest if it was running; end the task and the record.
    """
    linked = await _link_back(pool, migration, down_time)
    if linked is None:
        return
    instance, source = linked
    running = _was_running(instance)
    try:
        await compute.finish_revert(
            RequestContext.internal(),
            source.service.uuid,
            migration.instance_uuid,
            migration.uuid,
            power_on=running,
            flavor=migration.old_flavor if migration.in_place else None,
        )
    except KeelError as exc:
        if is_transient(exc):
            raise
        await _step_failed(pool, migration, REVERT_ACTION, exc.message)
        return
    async with pool.acquire() as conn, conn.transaction():
        await moves.lock(conn, migration.uuid)
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


async def _link_back(
    pool: asyncpg.Pool, migration: Migration, down_time: float
) -> tuple[Instance, HostState] | None:
    """Link a ``reverting`` migration's server to its source, whose copy becomes its
    current one, and release the migration's claim on the destination; the server and
    the source's host, or ``None`` if there is nothing more to do.

    Done before the destination removes its copy, so that the copy it removes is never
    the server's current one. A server deleted meanwhile leaves the record ``reverted``.
    A server whose task was ended (an admin's ``os-resetState``) before it was linked
    back still lives on the destination: the record becomes ``error``, nothing is
    removed, and the claims follow the server as a confirm's do; one reset after it was
    linked back is reverted, its guest on the source left as it is.
    """
    assert migration.source_compute_id is not None
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        current = await moves.lock(conn, migration.uuid)
        if current.status != MigrationStatus.REVERTING:
            LOG.info("migration %s was already reverted", migration.uuid, extra=_extra(migration))
            return None
        source = await compute_nodes.host_state_by_id(conn, migration.source_compute_id, down_time)
        instance = await instances.relink(
            conn,
            migration.instance_uuid,
            task=TaskState.RESIZE_REVERTING,
            node=source.node,
            flavor=migration.old_flavor,
            # The source's copy is the server's again (a resize in place kept its own).
            copy_token=current.source_token,
            set_token=not migration.in_place,
        )
        if instance is not None:
            await allocations.release(conn, migration.uuid, migration.dest_compute_id)
            return instance, source
        found = await instances.find(conn, migration.instance_uuid)
        deleted = found is None or found.deleted_at is not None
        # Linked back by an earlier run of this step, then reset: the revert is done but
        # for starting the guest, which is left as it is (its host reports its power).
        linked_before = (
            found is not None
            and not deleted
            and not migration.in_place
            and found.compute_id == migration.source_compute_id
        )
        await moves.swap_status(
            conn,
            migration.uuid,
            expected=[MigrationStatus.REVERTING],
            new=MigrationStatus.REVERTED if deleted or linked_before else MigrationStatus.ERROR,
        )
        if linked_before:
            await instance_actions.finish(
                conn,
                migration.instance_uuid,
                REVERT_ACTION,
                "the server's task was ended (its state was reset) before its guest was "
                "started again",
            )
        elif not deleted:
            # It stays where it lives: the destination's copy is its current one again
            # (keel-api made the source's current when it took the revert), and its claims
            # follow it there, as a confirm's do.
            if not migration.in_place:
                await instances.set_copy_token(conn, migration.instance_uuid, migration.uuid)
            await _claims_to_destination(conn, migration)
            await instance_actions.finish(
                conn,
                migration.instance_uuid,
                REVERT_ACTION,
                "the server's task was ended (its state was reset) before it was reverted",
            )
    if deleted:
        LOG.info(
            "migration %s is reverted without its instance (deleted)",
            migration.uuid,
            extra=_extra(migration),
        )
    elif linked_before:
        LOG.warning(
            "migration %s of server %s is reverted, but the server's task was ended (its "
            "state was reset) before its guest on %s was started again: it is left as it is",
            migration.uuid,
            migration.instance_uuid,
            migration.source_compute,
            extra={**_extra(migration), "decision": "revert_reset"},
        )
    else:
        LOG.warning(
            "migration %s of server %s is not reverted: the server's task was ended (its "
            "state was reset) first; it stays on %s, which holds its claim now, and the "
            "copy on %s is its agent's to judge",
            migration.uuid,
            migration.instance_uuid,
            migration.dest_compute,
            migration.source_compute,
            extra={**_extra(migration), "decision": "revert_abandoned"},
        )
    return None


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
        await moves.lock(conn, migration.uuid)
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


async def confirm_evacuation(pool: asyncpg.Pool, req: EvacuationConfirmed) -> None:
    """The source removed its copy: ``done`` → ``completed``, its claim there released.

    The claim stays if the instance lives on that host again (a later move brought it
    back): it is then the instance's live claim.
    """
    async with pool.acquire() as conn, conn.transaction():
        node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        migration = await moves.lock(conn, req.migration_uuid)
        if migration.source_compute_id != node.id:
            raise Conflict(
                f"evacuation {migration.uuid} is not away from node {node.uuid}; refusing to "
                "confirm it for that node"
            )
        completed = await moves.swap_status(
            conn,
            migration.uuid,
            expected=[MigrationStatus.DONE],
            new=MigrationStatus.COMPLETED,
        )
        released = None
        if completed is not None:
            instance = await instances.find(conn, migration.instance_uuid)
            if instance is None or instance.compute_id != node.id:
                released = await allocations.release(conn, migration.instance_uuid, node.id)
    if completed is None:
        LOG.info("evacuation %s was already confirmed", migration.uuid, extra=_extra(migration))
        return
    LOG.info(
        "host %s removed its copy of server %s: evacuation %s is completed%s",
        node.host,
        migration.instance_uuid,
        migration.uuid,
        "; its claim there is released" if released else "",
        extra={**_extra(migration), "decision": "evacuation_completed"},
    )
