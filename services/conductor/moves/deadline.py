"""Moves that overrun ``KEEL_MOVE_TIMEOUT``: ended, never left hanging.

A move ``accepted`` or ``pre-migrating`` for longer than the timeout (its record not
changed for that long) lost its conductor, its message or its destination's agent. The
sweep ends it, in one transaction per move taken with the documented lock order (the
instance, the record, the claims):

* the record becomes ``error`` and the move's claim (on the destination) is released;
* an **evacuation**'s server goes to ERROR on its source (whose host is down) with a
  fault saying the move timed out; the destination's agent, if up, is asked to shut the
  copy it may have built down;
* a **cold migration**'s server goes back to its live source: its task ends and it keeps
  its state (ACTIVE or SHUTOFF); the destination's agent is asked to remove the copy this
  move made, if it made one, and then the source's agent to start the guest again if it
  was running (its guest was shut down for the move). If the source's agent cannot be
  reached, the server goes to ERROR with a fault saying so.

**Never two running copies.** A move ``pre-migrating`` may have built and started its
copy on the destination. If that host is down but not forced down, its guest may still
run (its agent may have died while the host runs on), so nothing starts the source's
copy: a cold migration's server stays SHUTOFF on its source, and keel-api refuses to
start or hard-reboot the server (:func:`shared.host_fencing.stray_copy_may_run`) until the
destination's agent is back — it stops the stray copy when it reports its guests —
or an operator forces that host down. The instance action (and an evacuation's fault) say so.

The instance action records the timeout. Several conductors sweep at once safely: each
move is ended by one compare-and-swap on its status; the others find it ended.
"""

from __future__ import annotations

import logging

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.moves.arrival import extra, remove_copy
from shared import host_fencing
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, KeelError
from shared.objects.migration import (
    EVACUATION,
    KINDS,
    Migration,
    MigrationStatus,
    MigrationType,
)
from shared.objects.states import PowerState, VmState

LOG = logging.getLogger(__name__)

#: Statuses a move may not stay in for longer than the timeout.
TIMED = (MigrationStatus.ACCEPTED, MigrationStatus.PRE_MIGRATING)


class MoveDeadline:
    def __init__(
        self,
        pool: asyncpg.Pool,
        compute: ComputeAPI,
        *,
        timeout: float,
        down_time: float,
        margin: float = 30.0,
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.timeout = timeout
        self.down_time = down_time
        #: KEEL_FENCING__MARGIN: added to a fence's lease before its guests count as off.
        self.margin = margin

    @property
    def enabled(self) -> bool:
        return self.timeout > 0

    async def sweep(self) -> int:
        """End every move past the deadline; return how many this sweep ended."""
        if not self.enabled:
            return 0
        async with self.pool.acquire() as conn:
            overdue = await moves.older_than(conn, TIMED, self.timeout)
        ended = 0
        for migration in overdue:
            if migration.migration_type == MigrationType.LIVE_MIGRATION:
                continue  # services.conductor.moves.live_deadline
            if await self._expire(migration):
                ended += 1
        return ended

    async def _expire(self, migration: Migration) -> bool:
        kind = KINDS[migration.migration_type]
        message = (
            f"The {kind.migration_type} did not finish within {self.timeout:g}s "
            f"(KEEL_MOVE_TIMEOUT); it was {migration.status}"
            + (f" to {migration.dest_compute}" if migration.dest_compute else "")
        )
        async with self.pool.acquire() as conn, conn.transaction():
            current = await moves.lock(conn, migration.uuid)
            if current.status not in TIMED or current.updated_at != migration.updated_at:
                return False
            stray = await self._stray_copy_host(conn, current)
            if stray is not None:
                message += (
                    f"; its destination {stray} is down but not forced down, so the copy "
                    "there may still run: the server cannot be started on its source until "
                    f"{stray}'s agent is back or the host is forced down (openstack compute "
                    f"service set --down {stray} keel-compute)"
                )
            await moves.swap_status(
                conn, migration.uuid, expected=list(TIMED), new=MigrationStatus.ERROR
            )
            released = await allocations.release_consumer(conn, migration.uuid)
            instance = await instances.find(conn, migration.instance_uuid)
            tasks = tuple(dict.fromkeys((kind.choosing, kind.building)))
            was_running = instance is not None and instance.power_state != PowerState.SHUTDOWN
            # A server no longer on the move's source moved on since (an admin reset it,
            # then it was evacuated): what this move would put back is not its copy.
            moved_on = instance is None or instance.compute_id not in (
                None,
                migration.source_compute_id,
            )
            if kind is EVACUATION:
                for task in tasks:
                    await instances.fail_task(conn, migration.instance_uuid, task, message=message)
            elif stray is not None:
                # Its source guest was shut down for the move, and stays so.
                await instances.finish_task(
                    conn,
                    migration.instance_uuid,
                    tasks,
                    vm_state=VmState.STOPPED,
                    power_state=PowerState.SHUTDOWN,
                )
            else:
                stopped = instance is not None and instance.vm_state == VmState.STOPPED
                await instances.finish_task(
                    conn,
                    migration.instance_uuid,
                    tasks,
                    vm_state=VmState.STOPPED if stopped else VmState.ACTIVE,
                )
            await instance_actions.finish(conn, migration.instance_uuid, kind.action, message)
        if kind is EVACUATION:
            outcome = "; the server is in ERROR"
        elif moved_on:
            outcome = "; the server is no longer on its source (it moved on since): left as it is"
        elif stray is not None:
            outcome = f"; the server stays SHUTOFF on its source: the copy on {stray} may run"
        else:
            outcome = "; back on its source"
        LOG.warning(
            "%s %s of server %s timed out (%s): the record is error, %d claim(s) released%s",
            kind.migration_type,
            migration.uuid,
            migration.instance_uuid,
            migration.status,
            len(released),
            outcome,
            extra={**extra(migration), "decision": "move_timed_out"},
        )
        if kind is EVACUATION:
            await self._stop_destination_copy(migration)
        elif stray is None and not moved_on:
            await self._back_to_source(migration, was_running, message)
        return True

    async def _stray_copy_host(self, conn: Connection, migration: Migration) -> str | None:
        """The destination's host name if the copy this move may have built there may run
        on after the move ends (its host down but not forced down); ``None`` otherwise."""
        dest = migration.dest_compute_id
        if (
            migration.status != MigrationStatus.PRE_MIGRATING
            or dest is None
            or dest == migration.source_compute_id
        ):
            return None
        try:
            host = await compute_nodes.host_state_by_id(conn, dest, self.down_time)
        except ComputeNodeNotFound:
            return None
        silent = await host_fencing.silent_for(conn, host.service.id)
        may_run = host_fencing.stray_copy_may_run(host.service, silent, margin=self.margin)
        return host.node.host if may_run else None

    async def _stop_destination_copy(self, migration: Migration) -> None:
        """Ask an up destination to shut down the copy an evacuation may have started
        there: the server is in ERROR on its source, and may be rebuilt or rebooted there.

        The agent reports no task for it (the server has none), and its next guest report
        finds the copy explained by no live move and keeps it stopped.
        """
        dest = migration.dest_compute_id
        if migration.status != MigrationStatus.PRE_MIGRATING or dest is None:
            return
        async with self.pool.acquire() as conn:
            try:
                host = await compute_nodes.host_state_by_id(conn, dest, self.down_time)
            except ComputeNodeNotFound:
                return
        if not host.service.is_up:
            return
        try:
            await self.compute.stop_instance(
                RequestContext.internal(), host.service.uuid, migration.instance_uuid
            )
        except KeelError as exc:
            LOG.warning(
                "evacuation %s of server %s timed out; could not ask %s to shut its copy "
                "down (%s): its next guest report stops it",
                migration.uuid,
                migration.instance_uuid,
                host.node.host,
                exc.message,
                extra=extra(migration),
            )

    async def _back_to_source(self, migration: Migration, running: bool, why: str) -> None:
        """Start the source guest again if it was running; remove the destination's copy."""
        try:
            if migration.status == MigrationStatus.PRE_MIGRATING:
                await remove_copy(
                    self.pool, self.compute, migration, migration.dest_compute_id, self.down_time
                )
            if running:
                await self._power_on_source(migration)
        except KeelError as exc:
            fault = f"{why}; its source guest could not be started again: {exc.message}"
            async with self.pool.acquire() as conn:
                await conn.execute(
                    """UPDATE instances SET vm_state = $2, fault = $3, updated_at = now()
                        WHERE uuid = $1 AND deleted_at IS NULL AND task_state IS NULL""",
                    migration.instance_uuid,
                    VmState.ERROR.value,
                    instances.new_fault(fault).model_dump(mode="json"),
                )
            LOG.warning(
                "migration %s timed out and server %s could not be started on %s again (%s): "
                "it is in ERROR",
                migration.uuid,
                migration.instance_uuid,
                migration.source_compute,
                exc.message,
                extra=extra(migration),
            )

    async def _power_on_source(self, migration: Migration) -> None:
        assert migration.source_compute_id is not None
        async with self.pool.acquire() as conn:
            try:
                source = await compute_nodes.host_state_by_id(
                    conn, migration.source_compute_id, self.down_time
                )
            except ComputeNodeNotFound:
                raise KeelError("its compute node no longer exists") from None
        await self.compute.finish_revert(
            RequestContext.internal(),
            source.service.uuid,
            migration.instance_uuid,
            migration.uuid,
            power_on=True,
            # A resize on its own host may already have given the guest the new flavor.
            flavor=migration.old_flavor if migration.in_place else None,
        )
        async with self.pool.acquire() as conn:
            await conn.execute(
                """UPDATE instances SET power_state = $2, updated_at = now()
                    WHERE uuid = $1 AND deleted_at IS NULL AND task_state IS NULL
                      AND vm_state = $3""",
                migration.instance_uuid,
                int(PowerState.RUNNING),
                VmState.ACTIVE.value,
            )
