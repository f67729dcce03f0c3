"""Live migrations that overrun ``KEEL_MOVE_TIMEOUT`` (their record unchanged that long).

A running migration's source reports progress four times a second, so only a lost
message, a dead conductor or a dead agent leaves a record unchanged for that long:

* **before the switch-over** (``accepted``, ``preparing``, ``running``): the destination
  has no copy; the record becomes ``error``, its claim is released, the server's task
  ends (it stays on its source, ACTIVE or PAUSED) and the source's agent, if up, is asked
  to resume a guest the migration left paused (else its ``live_migrate`` message, once
  delivered again, finds the migration ended and resumes it);
* **during the switch-over** (``post-migrating``): the source's guest is paused and the
  destination's may have started: the switch-over is carried forward
  (:func:`services.conductor.moves.live.finish_switch`), never back, and the source's
  copy is removed once it completed (its agent's next guest report removes it if it is
  down). Until the destination's agent answers, the record stays ``post-migrating``.

Several conductors may sweep at once: each step is a compare-and-swap on the record.
"""

from __future__ import annotations

import logging

import asyncpg

from services.compute.live_rpc import LiveComputeAPI
from services.compute.rpcapi import ComputeAPI
from services.conductor.live_rpc import SwitchOutcome
from services.conductor.moves import live
from services.conductor.moves.arrival import remove_copy
from shared.context import RequestContext
from shared.db import compute_nodes, instances, live_moves, moves
from shared.exceptions import ComputeNodeNotFound, KeelError
from shared.objects.migration import Migration, MigrationStatus, MigrationType
from shared.objects.states import VmState

LOG = logging.getLogger(__name__)

S = MigrationStatus
TIMED = (S.ACCEPTED, S.PREPARING, S.RUNNING, S.POST_MIGRATING)


async def sweep(
    pool: asyncpg.Pool, compute: ComputeAPI, *, timeout: float, down_time: float
) -> int:
    """Deal with every overdue live migration; how many this pass ended or drove on."""
    if timeout <= 0:
        return 0
    async with pool.acquire() as conn:
        overdue = await moves.older_than(conn, TIMED, timeout)
    done = 0
    for migration in overdue:
        if migration.migration_type != MigrationType.LIVE_MIGRATION:
            continue
        try:
            if migration.status == S.POST_MIGRATING:
                done += await _carry_forward(pool, compute, migration, down_time)
            else:
                done += await _expire(pool, compute, migration, timeout, down_time)
        except KeelError as exc:
            LOG.warning(
                "live migration %s of server %s is overdue (%s) and could not be dealt with "
                "now (%s): the next sweep tries again",
                migration.uuid,
                migration.instance_uuid,
                migration.status,
                exc.message,
                extra={"migration_uuid": str(migration.uuid)},
            )
    return done


async def _expire(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    migration: Migration,
    timeout: float,
    down_time: float,
) -> int:
    message = (
        f"The live-migration did not finish within {timeout:g}s (KEEL_MOVE_TIMEOUT); it was "
        f"{migration.status}" + (f" to {migration.dest_compute}" if migration.dest_compute else "")
    )
    async with pool.acquire() as conn, conn.transaction():
        current = await moves.lock(conn, migration.uuid)
        if current.updated_at != migration.updated_at:
            return 0
        ended = await live_moves.end_in(conn, migration.uuid, (migration.status,), S.ERROR, message)
    if ended is None:
        return 0
    LOG.warning(
        "live migration %s of server %s timed out (%s): the server stays on %s",
        migration.uuid,
        migration.instance_uuid,
        migration.status,
        migration.source_compute,
        extra={"migration_uuid": str(migration.uuid), "decision": "move_timed_out"},
    )
    if migration.status == S.RUNNING and migration.source_compute_id is not None:
        async with pool.acquire() as conn:
            try:
                source = await compute_nodes.host_state_by_id(
                    conn, migration.source_compute_id, down_time
                )
            except ComputeNodeNotFound:
                return 1
            instance = await instances.find(conn, migration.instance_uuid)
        if source.service.is_up and instance is not None:
            await LiveComputeAPI(compute).rollback_live_migration(
                RequestContext.internal(),
                source.service.uuid,
                migration.instance_uuid,
                migration.uuid,
                resume=instance.vm_state != VmState.PAUSED,
            )
    return 1


async def _carry_forward(
    pool: asyncpg.Pool, compute: ComputeAPI, migration: Migration, down_time: float
) -> int:
    LOG.warning(
        "live migration %s of server %s stalled during its switch-over: carrying it forward "
        "(the source's guest is paused; the destination's copy wins)",
        migration.uuid,
        migration.instance_uuid,
        extra={"migration_uuid": str(migration.uuid), "decision": "live_migration_forward"},
    )
    answer = await live.finish_switch(pool, compute, migration, down_time=down_time)
    if answer.outcome is SwitchOutcome.COMPLETED:
        await remove_copy(pool, compute, migration, migration.source_compute_id, down_time)
    elif answer.outcome is SwitchOutcome.RESUME:
        async with pool.acquire() as conn:
            try:
                source = await compute_nodes.host_state_by_id(
                    conn, migration.source_compute_id or 0, down_time
                )
            except ComputeNodeNotFound:
                return 1
        if source.service.is_up:
            await LiveComputeAPI(compute).rollback_live_migration(
                RequestContext.internal(),
                source.service.uuid,
                migration.instance_uuid,
                migration.uuid,
                resume=True,
            )
    return 1
