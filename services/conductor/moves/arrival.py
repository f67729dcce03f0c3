"""The destination's result of a move (``move_result``, a cast from its agent).

One handler for both kinds. The move must be ``pre-migrating``; then, in one
transaction that locks the instance, then the record, then the claims
(:func:`shared.db.moves.lock`):

* **success**: the instance's compute link moves to the destination and its task ends
  (a resized one takes its new flavor).
  An evacuation's record becomes ``done`` and the migration's claim there becomes the
  instance's (the instance keeps its claim on the source until that host confirms it
  removed its copy, or the host is deleted for good). A cold migration's record becomes
  ``finished`` (VERIFY_RESIZE) and both claims stay until confirm or revert;
* **failure**: the record is ``failed``, the migration's claim released, the instance in
  ERROR on its source with the agent's message.

Before the destination builds a copy, and again once it has, it asks whether the move
still waits for that copy there (``check_move``): a rebuild delivered after the move was
ended (its deadline passed, the server deleted) builds nothing, and a copy built while
the move ended is removed at once, before anything starts the source's copy again.

A result that finds the record no longer ``pre-migrating`` is a repeat or arrived late:
the move was ended meanwhile (the server was deleted, the move deadline passed). If the
destination built a copy for a move that will not have it — the server is deleted, or a
cold migration was given up (its source copy is the live one) — that copy is removed,
and only if it is the copy this move made. A late evacuation copy of a server that still
exists is kept for an operator: its source is dead, so it may be the only one.
"""

from __future__ import annotations

import logging
from enum import Enum

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import BuildCheck, BuildVerdict, CheckMove, MoveResult
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, NotFound
from shared.objects.migration import (
    EVACUATION,
    KINDS,
    RESIZE,
    Migration,
    MigrationStatus,
    MoveKind,
)
from shared.objects.states import PowerState, VmState

LOG = logging.getLogger(__name__)


def extra(migration: Migration) -> dict[str, str]:
    return {"instance_uuid": str(migration.instance_uuid), "migration_uuid": str(migration.uuid)}


class _Arrival(Enum):
    ARRIVED = "arrived"
    REPEATED = "repeated"
    #: The server was deleted meanwhile: the destination's copy must go.
    DELETED = "deleted"
    #: The instance's task was ended by someone else (an operator's reset): the record
    #: is ended as ``error`` and both copies are kept for the operator.
    ABANDONED = "abandoned"


async def check_move(pool: asyncpg.Pool, req: CheckMove) -> BuildCheck:
    """Whether move ``req.migration_uuid`` waits for its copy on the asking node: only a
    move ``pre-migrating`` to that very node does."""
    async with pool.acquire() as conn:
        try:
            node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
            migration = await moves.get(conn, req.migration_uuid)
        except (ComputeNodeNotFound, NotFound) as exc:
            return BuildCheck(verdict=BuildVerdict.ABANDON, reason=str(exc))
    if migration.dest_compute_id != node.id:
        return BuildCheck(
            verdict=BuildVerdict.LEAVE,
            reason=f"move {migration.uuid} goes to {migration.dest_compute or 'another node'}",
        )
    if migration.status != MigrationStatus.PRE_MIGRATING:
        return BuildCheck(
            verdict=BuildVerdict.ABANDON,
            reason=f"move {migration.uuid} is {migration.status}: it waits for no copy",
        )
    return BuildCheck(verdict=BuildVerdict.BUILD, reason="the move waits for its copy here")


async def record_move_result(
    pool: asyncpg.Pool, compute: ComputeAPI, req: MoveResult, down_time: float
) -> None:
    async with pool.acquire() as conn:
        migration = await moves.get(conn, req.migration_uuid)
    kind = KINDS[migration.migration_type]
    if migration.status != MigrationStatus.PRE_MIGRATING:
        await _late(pool, compute, kind, migration=migration, req=req, down_time=down_time)
        return
    if not req.success:
        await _failed(pool, kind, migration, req.message or "the build failed")
        return
    outcome = await _arrived(pool, kind, migration)
    if outcome is _Arrival.DELETED:
        LOG.warning(
            "server %s was deleted while it was moved to %s; asking that host to remove the "
            "copy it built",
            migration.instance_uuid,
            migration.dest_compute,
            extra=extra(migration),
        )
        await remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)


async def _arrived(pool: asyncpg.Pool, kind: MoveKind, migration: Migration) -> _Arrival:
    assert migration.dest_compute_id is not None
    async with pool.acquire() as conn, conn.transaction():
        current = await moves.lock(conn, migration.uuid)
        if current.status != MigrationStatus.PRE_MIGRATING:
            return _Arrival.REPEATED
        dest = await compute_nodes.get_by_id(conn, migration.dest_compute_id)
        instance = await instances.find(conn, migration.instance_uuid)
        if instance is None or instance.deleted_at is not None:
            await _end(conn, migration, MigrationStatus.CANCELLED)
            return _Arrival.DELETED
        # An evacuation asked for at 2.95 or later was built powered off: it ends stopped.
        stopped = instance.vm_state == VmState.STOPPED or migration.end_stopped
        if kind is EVACUATION:
            vm_state = VmState.STOPPED if stopped else VmState.ACTIVE
            status = MigrationStatus.DONE
        else:
            vm_state, status = VmState.RESIZED, MigrationStatus.FINISHED
        moved = await instances.move_to(
            conn,
            instance.uuid,
            task=kind.building,
            node=dest,
            vm_state=vm_state,
            power_state=PowerState.SHUTDOWN if stopped else PowerState.RUNNING,
            flavor=migration.new_flavor,
            # The copy this move built is the server's now (a resize in place keeps its).
            copy_token=None if migration.in_place else migration.uuid,
        )
        if moved is None:
            await _end(conn, migration, MigrationStatus.ERROR)
            await instance_actions.finish(
                conn,
                instance.uuid,
                kind.action,
                f"the server's task was ended ({instance.task_state or 'none'}) while it "
                f"was moved to {dest.host}; its copy there is kept",
            )
            abandoned = True
        else:
            await moves.swap_status(
                conn, migration.uuid, expected=[MigrationStatus.PRE_MIGRATING], new=status
            )
            if kind is EVACUATION:
                await _take_over_claim(conn, migration, dest.id)
            await instance_actions.finish(conn, instance.uuid, kind.action)
            abandoned = False
    if abandoned:
        LOG.warning(
            "%s %s of server %s arrived on %s, but the server's task was ended meanwhile: "
            "the record is error, both copies are kept for an operator",
            kind.migration_type,
            migration.uuid,
            migration.instance_uuid,
            dest.host,
            extra={**extra(migration), "decision": "move_abandoned"},
        )
        return _Arrival.ABANDONED
    if kind is EVACUATION:
        LOG.info(
            "server %s was rebuilt on %s (evacuation %s is done); %s keeps its claim until "
            "its agent confirms it removed its copy",
            migration.instance_uuid,
            dest.host,
            migration.uuid,
            migration.source_compute,
            extra={**extra(migration), "decision": "evacuation_done"},
        )
    else:
        LOG.info(
            "server %s was %s from %s to %s (%s %s is finished): it waits for confirm or "
            "revert, holding claims on both hosts",
            migration.instance_uuid,
            "resized" if kind is RESIZE else "migrated",
            migration.source_compute,
            dest.host,
            kind.migration_type,
            migration.uuid,
            extra={**extra(migration), "decision": f"{kind.migration_type}_finished"},
        )
    return _Arrival.ARRIVED


async def _take_over_claim(conn: Connection, migration: Migration, node_id: int) -> None:
    """The migration's claim on the destination becomes the instance's own.

    If the instance already holds a claim there (it returns to a host that never gave
    its claim back), the migration's is released instead, so the host counts it once.
    """
    if not await allocations.hand_over(
        conn, node_id, from_consumer=migration.uuid, to_consumer=migration.instance_uuid
    ):
        await allocations.release(conn, migration.uuid, node_id)


async def _end(conn: Connection, migration: Migration, status: MigrationStatus) -> None:
    ended = await moves.swap_status(
        conn, migration.uuid, expected=[MigrationStatus.PRE_MIGRATING], new=status
    )
    if ended is not None:
        await allocations.release_consumer(conn, migration.uuid)


async def _failed(pool: asyncpg.Pool, kind: MoveKind, migration: Migration, message: str) -> None:
    what = "Evacuation" if kind is EVACUATION else "Migration"
    fault = f"{what} to {migration.dest_compute} failed: {message}"
    async with pool.acquire() as conn, conn.transaction():
        current = await moves.lock(conn, migration.uuid)
        if current.status != MigrationStatus.PRE_MIGRATING:
            return
        await _end(conn, migration, MigrationStatus.FAILED)
        await instances.fail_task(conn, migration.instance_uuid, kind.building, message=fault)
        await instance_actions.finish(conn, migration.instance_uuid, kind.action, fault)
    LOG.warning(
        "%s %s failed on %s: %s; its claim there is released and server %s stays on %s, in ERROR",
        kind.migration_type,
        migration.uuid,
        migration.dest_compute,
        message,
        migration.instance_uuid,
        migration.source_compute,
        extra={**extra(migration), "decision": f"{kind.migration_type}_failed"},
    )


async def _late(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    kind: MoveKind,
    *,
    migration: Migration,
    req: MoveResult,
    down_time: float,
) -> None:
    """A result for a move that is no longer ``pre-migrating``: a repeat, or too late."""
    ended = migration.status in (
        MigrationStatus.ERROR,
        MigrationStatus.FAILED,
        MigrationStatus.CANCELLED,
    )
    if not req.success or not ended:
        LOG.info(
            "ignoring a result for %s %s: it is %s (already handled)",
            kind.migration_type,
            migration.uuid,
            migration.status,
            extra=extra(migration),
        )
        return
    async with pool.acquire() as conn:
        instance = await instances.find(conn, migration.instance_uuid)
    deleted = instance is None or instance.deleted_at is not None
    if not deleted and kind is EVACUATION:
        LOG.warning(
            "evacuation %s of server %s was ended (%s) before %s finished rebuilding it; "
            "the copy there is kept for an operator: its source is down, so it may be the "
            "only one",
            migration.uuid,
            migration.instance_uuid,
            migration.status,
            migration.dest_compute,
            extra={**extra(migration), "decision": "late_copy_kept"},
        )
        return
    LOG.warning(
        "%s %s of server %s was ended (%s) before %s finished building its copy; that copy "
        "is removed (%s)",
        kind.migration_type,
        migration.uuid,
        migration.instance_uuid,
        migration.status,
        migration.dest_compute,
        "the server was deleted" if deleted else "the server lives on its source",
        extra={**extra(migration), "decision": "late_copy_removed"},
    )
    await remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)


async def remove_copy(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    migration: Migration,
    node_id: int | None,
    down_time: float,
) -> bool:
    """Ask the agent of ``node_id`` to remove its copy; False if that agent is down.

    A copy on a move's destination is removed only if this move made it (the agent
    checks the guest's origin); an agent that is down removes it when it reports its
    guests again, as the records then say.
    """
    if node_id is None:
        return False
    async with pool.acquire() as conn:
        try:
            host = await compute_nodes.host_state_by_id(conn, node_id, down_time)
        except ComputeNodeNotFound:
            return False
    if not host.service.is_up:
        LOG.warning(
            "cannot remove the copy of server %s on %s for %s %s now: its compute service "
            "is down; its agent removes it when it reports its guests again",
            migration.instance_uuid,
            host.node.host,
            migration.migration_type,
            migration.uuid,
            extra=extra(migration),
        )
        return False
    only_origin = migration.uuid if node_id == migration.dest_compute_id else None
    await compute.remove_moved_guest(
        RequestContext.internal(),
        host.service.uuid,
        migration.instance_uuid,
        migration.uuid,
        only_origin=only_origin,
    )
    return True
