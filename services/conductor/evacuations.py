"""The ends of an evacuation: the destination's result, and the source's confirmation.

* ``move_result`` (cast, from the destination's agent): on success, one transaction moves
  the instance's compute link to the destination, hands the migration's claim there to
  the instance, and marks the record ``done``; the instance keeps its claim on the
  source until that host confirms. On failure the record is ``failed``, its claim
  released, and the instance in ERROR on its source.
* what a returning source's guests are to become is :mod:`services.conductor.guests`;
* ``evacuation_confirmed`` (call, from the source's agent once its copy is gone): the
  record becomes ``completed`` and the instance's claim on the source is released.

Every step is a compare-and-swap on the record's status, so twins and repeats are no-ops.
"""

from __future__ import annotations

import logging

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import (
    EvacuationConfirmed,
    MoveResult,
)
from services.conductor.tasks.move import EVACUATION
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves
from shared.db.pool import Connection
from shared.exceptions import Conflict
from shared.objects.migration import Migration, MigrationStatus
from shared.objects.states import PowerState, TaskState, VmState

LOG = logging.getLogger(__name__)


def _extra(migration: Migration) -> dict[str, str]:
    return {"instance_uuid": str(migration.instance_uuid), "migration_uuid": str(migration.uuid)}


async def record_move_result(
    pool: asyncpg.Pool, compute: ComputeAPI, req: MoveResult, down_time: float
) -> None:
    async with pool.acquire() as conn:
        migration = await moves.get(conn, req.migration_uuid)
    if migration.status != MigrationStatus.PRE_MIGRATING:
        LOG.info(
            "ignoring a result for evacuation %s: it is %s (already handled)",
            migration.uuid,
            migration.status,
            extra=_extra(migration),
        )
        return
    if req.success:
        if await _rebuilt(pool, migration):
            await _remove_rebuilt_copy(pool, compute, migration, down_time)
    else:
        await _rebuild_failed(pool, migration, req.message or "the rebuild failed")


async def _rebuilt(pool: asyncpg.Pool, migration: Migration) -> bool:
    """Finish a rebuilt evacuation; True if its instance was deleted meanwhile."""
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        dest = await compute_nodes.get_by_id(conn, migration.dest_compute_id)
        instance = await instances.find(conn, migration.instance_uuid)
        if instance is None or instance.deleted_at is not None:
            ended = await _end(conn, migration, MigrationStatus.ERROR)
            deleted = True
        else:
            stopped = instance.vm_state == VmState.STOPPED
            moved = await instances.move_to(
                conn,
                instance.uuid,
                task=TaskState.REBUILDING,
                node=dest,
                vm_state=VmState.STOPPED if stopped else VmState.ACTIVE,
                power_state=PowerState.SHUTDOWN if stopped else PowerState.RUNNING,
            )
            ended = None
            if moved is not None:
                ended = await moves.swap_status(
                    conn,
                    migration.uuid,
                    expected=[MigrationStatus.PRE_MIGRATING],
                    new=MigrationStatus.DONE,
                )
                await allocations.hand_over(
                    conn, dest.id, from_consumer=migration.uuid, to_consumer=instance.uuid
                )
                await instance_actions.finish(conn, instance.uuid, EVACUATION.action)
            deleted = False
    if deleted:
        return ended is not None
    if ended is None:
        LOG.info("evacuation %s was already finished", migration.uuid, extra=_extra(migration))
        return False
    LOG.info(
        "instance %s was rebuilt on %s (evacuation %s is done); %s keeps its claim until its "
        "agent confirms it removed its copy",
        migration.instance_uuid,
        dest.host,
        migration.uuid,
        migration.source_compute,
        extra={**_extra(migration), "decision": "evacuation_done"},
    )
    return False


async def _remove_rebuilt_copy(
    pool: asyncpg.Pool, compute: ComputeAPI, migration: Migration, down_time: float
) -> None:
    """The instance was deleted during its evacuation: remove what the destination built."""
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn:
        dest = await compute_nodes.host_state_by_id(conn, migration.dest_compute_id, down_time)
    LOG.warning(
        "instance %s was deleted while it was evacuated to %s; asking that host to remove "
        "the copy it built",
        migration.instance_uuid,
        dest.node.host,
        extra=_extra(migration),
    )
    await compute.terminate_instance(
        RequestContext.internal(), dest.service.uuid, migration.instance_uuid
    )


async def _end(conn: Connection, migration: Migration, status: MigrationStatus) -> Migration | None:
    ended = await moves.swap_status(
        conn, migration.uuid, expected=[MigrationStatus.PRE_MIGRATING], new=status
    )
    if ended is not None:
        await allocations.release_consumer(conn, migration.uuid)
    return ended


async def _rebuild_failed(pool: asyncpg.Pool, migration: Migration, message: str) -> None:
    fault = f"Evacuation to {migration.dest_compute} failed: {message}"
    async with pool.acquire() as conn, conn.transaction():
        ended = await _end(conn, migration, MigrationStatus.FAILED)
        if ended is None:
            return
        await instances.fail_task(
            conn, migration.instance_uuid, TaskState.REBUILDING, message=fault
        )
        await instance_actions.finish(conn, migration.instance_uuid, EVACUATION.action, fault)
    LOG.warning(
        "evacuation %s failed on %s: %s; its claim there is released and instance %s stays "
        "on %s, in ERROR",
        migration.uuid,
        migration.dest_compute,
        message,
        migration.instance_uuid,
        migration.source_compute,
        extra={**_extra(migration), "decision": "evacuation_failed"},
    )


async def confirm_evacuation(pool: asyncpg.Pool, req: EvacuationConfirmed) -> None:
    """The source removed its copy: ``done`` → ``completed``, its claim there released."""
    async with pool.acquire() as conn, conn.transaction():
        node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        migration = await moves.get(conn, req.migration_uuid)
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
            released = await allocations.release(conn, migration.instance_uuid, node.id)
    if completed is None:
        LOG.info("evacuation %s was already confirmed", migration.uuid, extra=_extra(migration))
        return
    LOG.info(
        "host %s removed its copy of instance %s: evacuation %s is completed%s",
        node.host,
        migration.instance_uuid,
        migration.uuid,
        "; its claim there is released" if released else "",
        extra={**_extra(migration), "decision": "evacuation_completed"},
    )
