"""Live migration: the conductor's side (conductor RPC 1.17).

keel-api recorded the migration (type ``live-migration``, ``accepted``, the server's
task ``migrating``; its vm state, ACTIVE or PAUSED, never changes). Then:

1. ``accepted``: the scheduler claims a destination for the migration (the host the
   operator named is a requested destination, every filter still run on it unless it
   was forced, 2.30 to 2.67), recorded with ``accepted`` → ``preparing``
   (:class:`LiveMoveTask`, the move workflow's scheduling and claim);
2. ``preparing``: the destination's agent checks it can take the copy
   (``prepare_live_migration``: builds nothing); ``preparing`` → ``running``; the source's
   agent is asked to copy (``live_migrate``), and asked again each time this step is
   delivered again once ``running`` (the first may never have arrived: its cast not
   confirmed, or the swap to ``running`` done with its answer lost; the source runs a
   repeat after the copy under way, and a repeat only asks the conductor);
3. ``running``: the source reports its progress (:func:`progress`, recorded in the
   record's memory and disk fields) and is told to go on, to abort, or to complete at
   once (``force_complete``);
4. the source pauses its guest and asks to switch over (:func:`switch`): ``running`` →
   ``post-migrating``; the destination starts its copy, carrying the move's copy token;
   then, in one transaction, the record becomes ``completed``, the server is linked to
   the destination (the copy token its copy's), the migration's claim there becomes the
   server's and its claim on the source is released; the answer tells the source to
   remove its copy.

**Endings.** No valid host (``error``), a destination that cannot prepare or start its
copy (``failed``), an abort (``cancelled``) and the deadline (``error``) all end the task
with the server as it was, on its source, the migration's claim released; the source
resumes its guest if it had paused it. Only a destination that said it could not start
its copy (and removed it) leads from ``post-migrating`` to ``failed``.

**Which copy wins when a process dies mid-migration.** Before ``post-migrating`` the
destination has no copy, so the source's wins: the deadline (``KEEL_MOVE_TIMEOUT`` of
silence: the source reports progress four times a second) ends the record ``error`` and
the source's agent resumes its guest (at once if up, else when the ``live_migrate``
message is delivered again once it is back). From ``post-migrating`` on, the source's
guest is paused and never resumed by keel: the destination's copy wins, and the
deadline's sweep carries the switch-over forward (:func:`finish_switch`), as often as it
takes; the source's copy is then removed by its agent, or by its next guest report
(``moved``). So there is never an instant with two running copies.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.live_rpc import LiveComputeAPI, LiveTarget
from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.conductor.boot_images import BootImages
from services.conductor.guest_data import instance_spec
from services.conductor.live_rpc import (
    LiveAction,
    LiveDirective,
    LiveMigrationProgress,
    LiveMigrationSwitch,
    LiveSwitch,
    SwitchOutcome,
)
from services.conductor.moves.arrival import remove_copy
from services.conductor.moves.task import MoveTask
from shared.context import RequestContext
from shared.db import (
    allocations,
    compute_nodes,
    fixed_ips,
    instance_actions,
    instances,
    live_moves,
    moves,
)
from shared.db.pool import Connection
from shared.exceptions import (
    ComputeNodeNotFound,
    KeelError,
    NotFound,
    NoValidHost,
    Unroutable,
)
from shared.objects.compute_node import HostState
from shared.objects.instance import Instance
from shared.objects.migration import LIVE_MIGRATION, Migration, MigrationStatus
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.settlement import is_transient

LOG = logging.getLogger(__name__)

S = MigrationStatus
#: Statuses before the switch-over: the source's copy is the server.
BEFORE_SWITCH = (S.ACCEPTED, S.PREPARING, S.RUNNING)
ACTION = LIVE_MIGRATION.action


def _extra(migration: Migration) -> dict[str, str]:
    return {"instance_uuid": str(migration.instance_uuid), "migration_uuid": str(migration.uuid)}


async def end(
    pool: asyncpg.Pool, migration_uuid: UUID, expected: tuple[str, ...], status: str, message: str
) -> Migration | None:
    async with pool.acquire() as conn, conn.transaction():
        ended = await live_moves.end_in(conn, migration_uuid, expected, status, message)
    if ended is not None:
        LOG.warning(
            "live migration %s of server %s is %s: %s; its claim on %s is released and the "
            "server stays on %s",
            ended.uuid,
            ended.instance_uuid,
            status,
            message,
            ended.dest_compute or "no destination",
            ended.source_compute,
            extra={**_extra(ended), "decision": f"live_migration_{status}"},
        )
    return ended


async def _host(pool: asyncpg.Pool, node_id: int | None, down_time: float) -> HostState:
    if node_id is None:
        raise KeelError("the migration names no compute node")
    async with pool.acquire() as conn:
        try:
            return await compute_nodes.host_state_by_id(conn, node_id, down_time)
        except ComputeNodeNotFound:
            raise KeelError(f"compute node {node_id} no longer exists") from None


async def _spec_for(
    pool: asyncpg.Pool,
    boot_images: BootImages | None,
    instance: Instance,
    node: HostState,
    migration_uuid: UUID,
) -> InstanceSpec:
    async with pool.acquire() as conn:
        addresses = await fixed_ips.for_instance(conn, instance.uuid)
        boot = None if boot_images is None else await boot_images.source(conn, instance.image_ref)
    return instance_spec(
        instance, node.node.hypervisor_hostname, list(addresses), boot, origin=migration_uuid
    )


class LiveMoveTask(MoveTask):
    """Steps 1 and 2: claim and record the destination, prepare it, start the copy."""

    name = "live migration"
    destination_status = MigrationStatus.PREPARING

    async def execute(self) -> None:
        async with self.pool.acquire() as conn:
            migration = await moves.get(conn, self.migration_uuid)
            instance = await instances.find(conn, migration.instance_uuid)
        self.migration = migration
        self.kind = LIVE_MIGRATION
        if migration.status == S.RUNNING and instance is not None and instance.deleted_at is None:
            # Delivered again after the record became running: the source may never have
            # been sent its copy (that cast was not confirmed, or the swap to running
            # took effect but its answer was lost). Sent again: a source that has it
            # already runs the repeat after it, and the repeat only asks the conductor.
            source = await _host(self.pool, migration.source_compute_id, self.service_down_time)
            target = await self._target_again(migration, instance)
            await self._send_copy(source, instance, target)
            LOG.info(
                "live migration %s is running: sent its source %s the copy again",
                migration.uuid,
                source.node.host,
                extra=self._extra(),
            )
            return
        if migration.status not in (S.ACCEPTED, S.PREPARING):
            LOG.info(
                "live migration %s is %s: already handled",
                migration.uuid,
                migration.status,
                extra=self._extra(),
            )
            return
        if instance is None or instance.deleted_at is not None:
            await end(self.pool, migration.uuid, BEFORE_SWITCH, S.ERROR, "the server was deleted")
            return
        if migration.status == S.ACCEPTED:
            selection = await self._schedule(migration, instance)
            destination = await self._record_destination(migration, selection)
        else:
            destination = await self._recorded_destination(migration)
        if destination is None:
            return
        source = await _host(self.pool, migration.source_compute_id, self.service_down_time)
        live = LiveComputeAPI(self.compute)
        spec = await _spec_for(self.pool, self.boot_images, instance, destination, migration.uuid)
        try:
            target = await live.prepare_live_migration(
                self.ctx, destination.service.uuid, spec, migration.uuid
            )
        except Unroutable as exc:
            raise KeelError(
                f"the destination {destination.node.host} has no queue on the broker "
                f"({exc.message})"
            ) from None
        async with self.pool.acquire() as conn:
            running = await moves.swap_status(
                conn, migration.uuid, expected=[S.PREPARING], new=S.RUNNING
            )
        if running is None:
            LOG.info(
                "live migration %s ended while its destination prepared: not starting the copy",
                migration.uuid,
                extra=self._extra(),
            )
            return
        await self._send_copy(source, instance, target)
        LOG.info(
            "live migration %s of server %s from %s to %s: the source copies it",
            migration.uuid,
            instance.uuid,
            source.node.host,
            destination.node.host,
            extra={**self._extra(), "decision": "live_migration_running"},
        )

    async def _target_again(self, migration: Migration, instance: Instance) -> LiveTarget | None:
        """The destination's target asked for again (its prepare is safe to repeat); ``None``
        if it cannot be had now: the source then simulates, and the switch-over fails
        cleanly on a destination whose driver receives guests itself."""
        try:
            dest = await _host(self.pool, migration.dest_compute_id, self.service_down_time)
            spec = await _spec_for(self.pool, self.boot_images, instance, dest, migration.uuid)
            return await LiveComputeAPI(self.compute).prepare_live_migration(
                self.ctx, dest.service.uuid, spec, migration.uuid
            )
        except KeelError as exc:
            LOG.warning(
                "live migration %s: its destination's target could not be asked again: %s",
                migration.uuid,
                exc.message,
                extra=self._extra(),
            )
            return None

    async def _send_copy(
        self, source: HostState, instance: Instance, target: LiveTarget | None
    ) -> None:
        """Ask the source's agent to copy the guest and then ask for the switch-over."""
        try:
            await LiveComputeAPI(self.compute).live_migrate(
                self.ctx,
                source.service.uuid,
                instance.uuid,
                self.migration_uuid,
                paused=instance.vm_state == VmState.PAUSED,
                memory_mb=instance.flavor.memory_mb,
                disk_gb=instance.flavor.root_gb,
                target=target,
            )
        except Unroutable as exc:
            raise KeelError(
                f"the source {source.node.host} has no queue on the broker ({exc.message})"
            ) from None

    async def rollback(self, exc: KeelError) -> None:
        status = S.ERROR if isinstance(exc, NoValidHost) else S.FAILED
        await end(self.pool, self.migration_uuid, BEFORE_SWITCH, status, exc.message)


async def progress(pool: asyncpg.Pool, req: LiveMigrationProgress) -> LiveDirective:
    """Step 3: record the source's progress; tell it what to do next."""
    async with pool.acquire() as conn:
        try:
            node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        except ComputeNodeNotFound as exc:
            return LiveDirective(action=LiveAction.ABORT, reason=exc.message)
        migration = await live_moves.record_progress(
            conn,
            req.migration_uuid,
            memory_total=req.memory_total_bytes,
            memory_processed=req.memory_processed_bytes,
            disk_total=req.disk_total_bytes,
            disk_processed=req.disk_processed_bytes,
        )
    if migration is None:
        return LiveDirective(action=LiveAction.ABORT, reason="no such migration")
    if migration.source_compute_id != node.id:
        return LiveDirective(
            action=LiveAction.ABORT,
            reason=f"migration {migration.uuid} is not from node {node.uuid}",
        )
    if migration.status == S.RUNNING:
        if migration.force_complete:
            return LiveDirective(action=LiveAction.COMPLETE, reason="force_complete was asked")
        return LiveDirective(action=LiveAction.CONTINUE)
    if migration.status in (S.POST_MIGRATING, S.COMPLETED):
        return LiveDirective(action=LiveAction.COMPLETE, reason="the switch-over is under way")
    return LiveDirective(
        action=LiveAction.ABORT, reason=f"live migration {migration.uuid} is {migration.status}"
    )


async def switch(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    req: LiveMigrationSwitch,
    *,
    down_time: float,
    boot_images: BootImages | None = None,
) -> LiveSwitch:
    """Step 4, asked by the source once its guest is paused."""
    async with pool.acquire() as conn, conn.transaction():
        node = await compute_nodes.get_by_uuid(conn, req.compute_node_uuid)
        migration = await moves.lock(conn, req.migration_uuid)
        if migration.source_compute_id != node.id:
            return LiveSwitch(
                outcome=SwitchOutcome.LEAVE,
                reason=f"migration {migration.uuid} is not from node {node.uuid}",
            )
        if migration.status == S.RUNNING:
            swapped = await moves.swap_status(
                conn, migration.uuid, expected=[S.RUNNING], new=S.POST_MIGRATING
            )
            assert swapped is not None
            migration = swapped
        instance = await instances.find(conn, migration.instance_uuid)
    if instance is None or instance.deleted_at is not None:
        return LiveSwitch(outcome=SwitchOutcome.LEAVE, reason="the server was deleted")
    if migration.status == S.COMPLETED:
        return LiveSwitch(outcome=SwitchOutcome.COMPLETED, reason="already switched over")
    if migration.status != S.POST_MIGRATING:
        # Ended before the switch-over (aborted, failed, timed out): a destination whose
        # driver received files for the guest removes them (only this move's).
        try:
            await remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)
        except KeelError as exc:
            LOG.warning(
                "live migration %s: its destination's leftovers were not removed: %s",
                migration.uuid,
                exc.message,
                extra=_extra(migration),
            )
        return LiveSwitch(
            outcome=SwitchOutcome.RESUME, reason=f"the migration is {migration.status}"
        )
    return await finish_switch(
        pool, compute, migration, down_time=down_time, boot_images=boot_images
    )


async def finish_switch(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    migration: Migration,
    *,
    down_time: float,
    boot_images: BootImages | None = None,
) -> LiveSwitch:
    """A ``post-migrating`` migration: the destination starts its copy, then the server
    is linked to it. Safe to run twice at once; a transient failure is raised (the
    source's guest stays paused; the deadline's sweep carries it on)."""
    async with pool.acquire() as conn:
        instance = await instances.find(conn, migration.instance_uuid)
    if instance is None or instance.deleted_at is not None:
        return LiveSwitch(outcome=SwitchOutcome.LEAVE, reason="the server was deleted")
    if instance.task_state != TaskState.MIGRATING:
        return await _task_ended(pool, compute, migration, down_time)
    dest = await _host(pool, migration.dest_compute_id, down_time)
    spec = await _spec_for(pool, boot_images, instance, dest, migration.uuid)
    paused = instance.vm_state == VmState.PAUSED
    try:
        await LiveComputeAPI(compute).start_live_copy(
            RequestContext.internal(),
            dest.service.uuid,
            spec,
            migration.uuid,
            paused=paused,
        )
    except Unroutable as exc:
        message = f"the destination {dest.node.host} has no queue on the broker ({exc.message})"
        return await _switch_failed(pool, migration, message)
    except KeelError as exc:
        if is_transient(exc):
            raise
        return await _switch_failed(pool, migration, exc.message)
    async with pool.acquire() as conn, conn.transaction():
        current = await moves.lock(conn, migration.uuid)
        done = current.status == S.POST_MIGRATING and await _link_to_destination(
            conn, current, dest, paused
        )
    if not done:
        if current.status == S.COMPLETED:
            return LiveSwitch(outcome=SwitchOutcome.COMPLETED, reason="already switched over")
        if current.status == S.POST_MIGRATING:
            return await _task_ended(pool, compute, migration, down_time)
        # Ended meanwhile: the server was deleted during the switch-over.
        await remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)
        return LiveSwitch(outcome=SwitchOutcome.LEAVE, reason=f"the migration is {current.status}")
    LOG.info(
        "live migration %s completed: server %s runs on %s; the copy on %s goes",
        migration.uuid,
        migration.instance_uuid,
        dest.node.host,
        migration.source_compute,
        extra={**_extra(migration), "decision": "live_migration_completed"},
    )
    return LiveSwitch(outcome=SwitchOutcome.COMPLETED, reason="the server runs on the destination")


async def _link_to_destination(
    conn: Connection, migration: Migration, dest: HostState, paused: bool
) -> bool:
    """Link the server to the destination and complete the record; False (nothing
    written) if the server is no longer migrating: its task was ended meanwhile."""
    moved = await instances.move_to(
        conn,
        migration.instance_uuid,
        task=TaskState.MIGRATING,
        node=dest.node,
        vm_state=VmState.PAUSED if paused else VmState.ACTIVE,
        power_state=PowerState.PAUSED if paused else PowerState.RUNNING,
        copy_token=migration.uuid,
    )
    if moved is None:
        return False
    await moves.swap_status(conn, migration.uuid, expected=[S.POST_MIGRATING], new=S.COMPLETED)
    if not await allocations.hand_over(
        conn, dest.node.id, from_consumer=migration.uuid, to_consumer=migration.instance_uuid
    ):
        await allocations.release(conn, migration.uuid, dest.node.id)
    if migration.source_compute_id is not None:
        await allocations.release(conn, migration.instance_uuid, migration.source_compute_id)
    await instance_actions.finish(conn, migration.instance_uuid, ACTION)
    return True


async def _task_ended(
    pool: asyncpg.Pool, compute: ComputeAPI, migration: Migration, down_time: float
) -> LiveSwitch:
    """The server's task was ended during the switch-over (an admin's ``os-resetState``):
    the server is where its record says, on the source. The destination removes the copy
    this move made there, if any; the migration fails and the source resumes its guest."""
    await remove_copy(pool, compute, migration, migration.dest_compute_id, down_time)
    return await _switch_failed(
        pool, migration, "the server's task was ended (its state was reset) during the switch-over"
    )


async def _switch_failed(pool: asyncpg.Pool, migration: Migration, message: str) -> LiveSwitch:
    """The destination could not start its copy (and holds none): back to the source."""
    ended = await end(
        pool,
        migration.uuid,
        (S.POST_MIGRATING,),
        S.FAILED,
        f"Live migration to {migration.dest_compute} failed: {message}",
    )
    if ended is None:
        async with pool.acquire() as conn:
            try:
                current = await moves.get(conn, migration.uuid)
            except NotFound:
                return LiveSwitch(outcome=SwitchOutcome.LEAVE, reason="no such migration")
        if current.status == S.COMPLETED:
            return LiveSwitch(outcome=SwitchOutcome.COMPLETED, reason="already switched over")
        if current.status == S.CANCELLED:
            return LiveSwitch(outcome=SwitchOutcome.LEAVE, reason="the server was deleted")
    return LiveSwitch(outcome=SwitchOutcome.RESUME, reason=message)
