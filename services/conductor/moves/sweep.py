"""Cold migrations that nobody finishes: confirm them in time, and drive stalled ends on.

A cold migration waits in VERIFY_RESIZE, holding claims on two hosts, until its owner
confirms or reverts it. Two things can leave it waiting for ever, and every conductor
sweeps periodically for both:

* **Auto-confirm.** With ``KEEL_RESIZE_CONFIRM_WINDOW`` > 0, a migration ``finished``
  for that many seconds is confirmed as if its owner had asked (an instance action
  ``confirmResize`` records it). 0, the default, never confirms on anyone's behalf.
* **Stalled confirm or revert.** A record ``confirming`` or ``reverting`` that has not
  moved for two RPC call timeouts lost its conductor or its message (a crash between
  keel-api's write and the conductor's work, or a message dead-lettered during an
  outage). The sweep runs that step again; every step is idempotent and guarded by the
  record's status, so running it beside a slow original is harmless.

A step whose agent is down is left alone: that agent finishes it when it reports its
guests on return (``copy_removed``). Several conductors sweep safely at once: the
record's compare-and-swap lets one of them start each confirmation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.moves import endings
from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, instances, moves
from shared.db.pool import Connection
from shared.objects.migration import CONFIRM_ACTION, Migration, MigrationStatus
from shared.objects.states import TaskState, VmState

LOG = logging.getLogger(__name__)

#: Longest pause between two sweeps, in seconds.
MAX_INTERVAL = 60.0
#: Migrations worked on at once by one sweep.
CONCURRENCY = 8


class _Lost(Exception):
    """The record moved on inside the confirmation's transaction: roll it back."""


async def _reset_on_destination(conn: Connection, migration: Migration) -> bool:
    """Whether an admin reset the server (``os-resetState``) while its migration waited for
    its confirm: no task, no longer RESIZED, and on the destination, where the migration
    left it. It cannot be confirmed by its owner any more; the window confirms it all the
    same (its state as the admin set it): it lives on the destination, whose copy is its
    current one, and the source's copy and claim are left over."""
    instance = await instances.find(conn, migration.instance_uuid)
    return (
        instance is not None
        and instance.deleted_at is None
        and instance.task_state is None
        and instance.vm_state != VmState.RESIZED
        and instance.compute_id == migration.dest_compute_id
    )


class MigrationSweep:
    def __init__(
        self,
        pool: asyncpg.Pool,
        compute: ComputeAPI,
        *,
        confirm_window: float,
        stall_after: float,
        down_time: float,
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.confirm_window = confirm_window
        self.stall_after = stall_after
        self.down_time = down_time

    @property
    def interval(self) -> float:
        """Often enough that a window or a stall is overrun by a tenth at most."""
        shortest = self.stall_after
        if self.confirm_window > 0:
            shortest = min(shortest, self.confirm_window)
        return min(MAX_INTERVAL, max(shortest / 10, 0.5))

    async def sweep(self) -> int:
        """One pass; return how many migrations it worked on."""
        async with self.pool.acquire() as conn:
            due = []
            if self.confirm_window > 0:
                due = await moves.unconfirmed_moves(conn, self.confirm_window)
            stalled = await moves.stalled_endings(conn, self.stall_after)
        limit = asyncio.Semaphore(CONCURRENCY)

        async def bounded(step: Awaitable[bool]) -> bool:
            async with limit:
                try:
                    return await step
                except Exception as exc:  # one migration's trouble must not stop the rest
                    LOG.warning("migration sweep: a step failed and is tried again later: %s", exc)
                    return False

        results = await asyncio.gather(
            *(bounded(self._auto_confirm(m)) for m in due),
            *(bounded(self._drive_on(m)) for m in stalled),
        )
        return sum(results)

    async def _agent_up(self, node_id: int | None) -> bool:
        assert node_id is not None
        async with self.pool.acquire() as conn:
            host = await compute_nodes.host_state_by_id(conn, node_id, self.down_time)
        return host.service.is_up

    async def _auto_confirm(self, migration: Migration) -> bool:
        if not await self._agent_up(migration.source_compute_id):
            LOG.info(
                "migration %s is past the confirm window but the compute service of %s is "
                "down: it is confirmed once that agent is back",
                migration.uuid,
                migration.source_compute,
                extra={"migration_uuid": str(migration.uuid)},
            )
            return False
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                started = await instances.begin_task(
                    conn,
                    migration.instance_uuid,
                    TaskState.RESIZE_CONFIRMING,
                    vm_states=(VmState.RESIZED,),
                )
                if started is None and not await _reset_on_destination(conn, migration):
                    return False
                swapped = await moves.swap_status(
                    conn,
                    migration.uuid,
                    expected=[MigrationStatus.FINISHED],
                    new=MigrationStatus.CONFIRMING,
                )
                if swapped is None:
                    raise _Lost
                await instance_actions.start(
                    conn,
                    RequestContext.internal(),
                    migration.instance_uuid,
                    CONFIRM_ACTION,
                )
        except _Lost:
            return False
        LOG.info(
            "confirming migration %s of instance %s on its owner's behalf: it waited "
            "more than %gs (KEEL_RESIZE_CONFIRM_WINDOW)",
            migration.uuid,
            migration.instance_uuid,
            self.confirm_window,
            extra={
                "instance_uuid": str(migration.instance_uuid),
                "migration_uuid": str(migration.uuid),
                "decision": "migration_auto_confirmed",
            },
        )
        await endings.confirm(self.pool, self.compute, migration.uuid, self.down_time)
        return True

    async def _drive_on(self, migration: Migration) -> bool:
        confirming = migration.status == MigrationStatus.CONFIRMING
        node_id = migration.source_compute_id if confirming else migration.dest_compute_id
        if not await self._agent_up(node_id):
            return False
        LOG.warning(
            "migration %s has been %s for more than %gs: running that step again",
            migration.uuid,
            migration.status,
            self.stall_after,
            extra={
                "instance_uuid": str(migration.instance_uuid),
                "migration_uuid": str(migration.uuid),
                "decision": "migration_step_retried",
            },
        )
        if confirming:
            await endings.confirm(self.pool, self.compute, migration.uuid, self.down_time)
        else:
            await endings.revert(self.pool, self.compute, migration.uuid, self.down_time)
        return True
