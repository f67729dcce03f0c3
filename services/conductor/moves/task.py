"""Moving an instance to another host: an evacuation, or a cold migration.

keel-api has recorded the move (a migration of type ``evacuation`` or ``migration``,
``accepted``) and set the instance's task (``rebuilding``, or ``resize_prep``). Delivered
at least once, each step converges:

1. a migration no longer ``accepted`` or ``pre-migrating`` was already handled;
2. while ``accepted``, the scheduler is asked for a host other than the source, the
   claim held by the migration (so the instance keeps its claim on the source
   meanwhile). A host the operator named is a requested destination: every filter
   still runs on it;
3. the destination is recorded with a compare-and-swap (``accepted`` →
   ``pre-migrating``);
4. for a cold migration, the source's agent shuts the guest down (keeping its data:
   until the migration is confirmed it is what a revert returns to);
5. for an evacuation, the new copy waits until the source's guests are known to be off
   (:func:`shared.host_fencing.fence_state`): a source forced down while its fence's
   lease still runs holds the move (``held_until``, said in the server's instance
   action) until that lease has run out; the conductors' sweep sends it on then
   (:mod:`services.conductor.moves.held`);
6. the destination's agent is asked to build the instance there — again on every
   delivery that finds the migration ``pre-migrating``, since the agent builds a guest
   once however often it is asked. Its result (``move_result``) finishes the move
   (:mod:`services.conductor.moves`).

No valid host: the record goes to ``error``; an evacuated instance goes to ERROR (its
host is gone), a migrated one back to its state (it still runs on its source). The
destination unreachable: ``failed``, its claim released, the instance in ERROR on its
source.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import (
    IN_PLACE,
    ComputeAPI,
    GuestDisk,
    topic_for,
)
from services.conductor.boot_images import BootImages
from services.conductor.guest_data import instance_spec
from services.conductor.moves import held
from services.conductor.workflow import TaskBase
from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared import host_fencing
from shared.context import RequestContext
from shared.db import (
    allocations,
    compute_nodes,
    fixed_ips,
    instance_actions,
    instances,
    moves,
    request_specs,
    services,
)
from shared.exceptions import BuildFailed, ComputeNodeNotFound, KeelError, NoValidHost, Unroutable
from shared.faults import FaultPoints
from shared.objects.compute_node import HostState
from shared.objects.instance import Instance, RequestedDestination
from shared.objects.migration import EVACUATION, KINDS, RESIZE, Migration, MigrationStatus
from shared.objects.states import VmState

LOG = logging.getLogger(__name__)

UNDER_WAY = (MigrationStatus.ACCEPTED, MigrationStatus.PRE_MIGRATING)
#: The statuses in which a move still holds its destination's claim under its own uuid
#: (a claim the scheduler gives a twin delivery of the same move too): from recording the
#: destination until an arrival hands the claim over (an evacuation's ``done``, a live
#: migration's ``completed``, a cold migration's ``confirmed``) or an end releases it.
HOLDS_DESTINATION_CLAIM = frozenset(
    {
        MigrationStatus.PRE_MIGRATING,
        MigrationStatus.PREPARING,
        MigrationStatus.RUNNING,
        MigrationStatus.POST_MIGRATING,
        MigrationStatus.FINISHED,
        MigrationStatus.CONFIRMING,
        MigrationStatus.REVERTING,
    }
)


class MoveTask(TaskBase):
    name = "move"
    #: The status a move takes once its destination is claimed and recorded.
    destination_status = MigrationStatus.PRE_MIGRATING

    def __init__(
        self,
        ctx: RequestContext,
        migration_uuid: UUID,
        *,
        pool: asyncpg.Pool,
        scheduler: SchedulerAPI,
        compute: ComputeAPI,
        service_down_time: float,
        faults: FaultPoints | None = None,
        boot_images: BootImages | None = None,
        same_host_resize: bool = False,
        fence_margin: float = 30.0,
    ) -> None:
        self.ctx = ctx
        #: KEEL_FENCING__MARGIN: added to a fence's lease before its guests count as off.
        self.fence_margin = fence_margin
        self.faults = faults or FaultPoints()
        self.boot_images = boot_images
        #: Whether a resize may stay on its host (KEEL_ALLOW_RESIZE_TO_SAME_HOST).
        self.same_host_resize = same_host_resize
        self.migration_uuid = migration_uuid
        self.pool = pool
        self.scheduler = scheduler
        self.compute = compute
        self.service_down_time = service_down_time
        self.migration: Migration | None = None
        self.kind = EVACUATION

    def _extra(self) -> dict[str, str]:
        instance = self.migration.instance_uuid if self.migration else None
        return {"instance_uuid": str(instance), "migration_uuid": str(self.migration_uuid)}

    async def execute(self) -> None:
        async with self.pool.acquire() as conn:
            migration = await moves.get(conn, self.migration_uuid)
            instance = await instances.find(conn, migration.instance_uuid)
        self.migration = migration
        self.kind = KINDS[migration.migration_type]
        if migration.status not in UNDER_WAY:
            LOG.info(
                "%s %s is %s: already handled",
                self.kind.migration_type,
                migration.uuid,
                migration.status,
                extra=self._extra(),
            )
            return
        if instance is None or instance.deleted_at is not None:
            await self._give_up(MigrationStatus.ERROR, "the instance was deleted")
            return
        if migration.status == MigrationStatus.ACCEPTED:
            selection = await self._schedule(migration, instance)
            destination = await self._record_destination(migration, selection)
            self.faults.reached("conductor.move.after_destination")
        else:
            destination = await self._recorded_destination(migration)
        if destination is None:
            return
        if self.kind is EVACUATION and await self._held_for_the_source(migration):
            return
        source_disk = None
        if self.kind is not EVACUATION:
            source_disk = await self._stop_source(migration, instance)
        await self._send_build(instance, destination, source_disk)

    async def _held_for_the_source(self, migration: Migration) -> bool:
        """Hold an evacuation while the source's guests may still run (its fence's lease
        runs on); True if held. A source that no longer exists holds nothing, nor one
        whose agent came back and reported the guest shut down (it keeps it off)."""
        assert migration.source_compute_id is not None
        if migration.source_off_at is not None:
            return False
        async with self.pool.acquire() as conn:
            try:
                source = await compute_nodes.host_state_by_id(
                    conn, migration.source_compute_id, self.service_down_time
                )
            except ComputeNodeNotFound:
                return False
            silent = await host_fencing.silent_for(conn, source.service.id)
        state = host_fencing.fence_state(
            source.service, silent, down_time=self.service_down_time, margin=self.fence_margin
        )
        if state.guests_off:
            return False
        await held.hold(self.pool, migration, state)
        return True

    async def _stop_source(self, migration: Migration, instance: Instance) -> GuestDisk | None:
        """Shut the source guest down; where its disk is, for the destination to copy."""
        assert migration.source_compute_id is not None
        async with self.pool.acquire() as conn:
            source = await compute_nodes.host_state_by_id(
                conn, migration.source_compute_id, self.service_down_time
            )
        try:
            prepared = await self.compute.prepare_migration(
                self.ctx, source.service.uuid, instance.uuid, migration.uuid
            )
        except Unroutable as exc:
            raise BuildFailed(
                f"the source host {source.node.host} has no queue on the broker ({exc.message})"
            ) from None
        return prepared.disk

    async def _schedule(self, migration: Migration, instance: Instance) -> Selection:
        async with self.pool.acquire() as conn:
            spec = await request_specs.get(conn, instance.uuid)
            source = None
            if migration.source_compute_id is not None:
                source = await compute_nodes.get_by_id(conn, migration.source_compute_id)
        ignore = [source.uuid] if source is not None else []
        if source is not None and await self._may_stay(migration, source.service_id):
            ignore = []
        destination: RequestedDestination | None = None
        if migration.dest_host is not None:
            # The host the operator named is a requested destination: the scheduler
            # narrows to its nodes and every filter still runs on them. A scheduler too
            # old for that (before 1.2) is told to avoid every other node instead.
            narrow = await self.scheduler.can_take_destinations()
            async with self.pool.acquire() as conn:
                target = await services.find_compute(
                    conn, migration.dest_host, self.service_down_time
                )
                if target is None:
                    raise NoValidHost(
                        f"No valid host was found. The requested host {migration.dest_host} "
                        "has no compute service."
                    )
                if migration.forced and not target.is_up:
                    # Forcing skips the scheduler's filters, not this: nothing there
                    # would prepare the move (its calls would time out, delivery after
                    # delivery).
                    raise NoValidHost(
                        f"No valid host was found. The requested host {migration.dest_host} "
                        "is down: its compute service is not up (forced down, or silent "
                        "longer than the service down time)."
                    )
                if narrow:
                    node_ids = [node.id for node in await compute_nodes.of_service(conn, target.id)]
                else:
                    ignore += await compute_nodes.uuids_elsewhere(conn, target.id)
            if narrow:
                if not node_ids:
                    raise NoValidHost(
                        f"No valid host was found. The requested host {migration.dest_host} "
                        "has no compute node."
                    )
                destination = RequestedDestination(
                    host=migration.dest_host, node_ids=node_ids, forced=migration.forced
                )
        # The instance's own spec is read afresh: whatever destination its create named is
        # not there (never stored), so a move without a named host chooses freely.
        spec = spec.model_copy(
            update={
                "ignore_nodes": ignore,
                "consumer_uuid": migration.uuid,
                "requested_destination": destination,
                # A resize is claimed, and built, with the flavor it resizes to.
                "flavor": migration.new_flavor or spec.flavor,
            }
        )
        return await self.scheduler.select_destinations(self.ctx, spec)

    async def _may_stay(self, migration: Migration, service_id: int | None) -> bool:
        """Whether a resize may land on its source host: allowed by the setting, to an
        agent that resizes a guest in place (compute 1.9)."""
        if not self.same_host_resize or migration.migration_type != RESIZE.migration_type:
            return False
        if service_id is None:
            return False
        async with self.pool.acquire() as conn:
            service = await services.get_by_id(conn, service_id, self.service_down_time)
        client = self.compute.client.for_topic(topic_for(service.uuid))
        return await client.can_send_version(IN_PLACE)

    async def _record_destination(
        self, migration: Migration, selection: Selection
    ) -> HostState | None:
        async with self.pool.acquire() as conn, conn.transaction():
            await moves.lock(conn, migration.uuid)
            dest = await compute_nodes.get_by_id(conn, selection.compute_node_id)
            moved = await moves.swap_status(
                conn,
                migration.uuid,
                expected=[MigrationStatus.ACCEPTED],
                new=self.destination_status,
                dest=dest,
            )
            if moved is not None and self.kind.building != self.kind.choosing:
                await instances.swap_task_state(
                    conn,
                    migration.instance_uuid,
                    expected=self.kind.choosing,
                    new=self.kind.building,
                )
            current = moved or await moves.get(conn, migration.uuid)
            same_claim = (
                current.dest_compute_id == dest.id and current.status in HOLDS_DESTINATION_CLAIM
            )
            lost = current.status != self.destination_status or not same_claim
            if not same_claim:
                # Someone ended the move (a delete, a withdrawal, the deadline), its claim
                # was handed over, or a twin recorded another host while this one was
                # chosen: give back the claim this run made. A twin that recorded this
                # host and carried the move on goes on with this very claim: kept.
                await allocations.release(conn, migration.uuid, dest.id)
        if lost and same_claim:
            LOG.info(
                "%s %s is already %s on %s: a twin delivery carries it on with this claim",
                self.kind.migration_type,
                migration.uuid,
                current.status,
                dest.host,
                extra=self._extra(),
            )
            return None
        if lost:
            LOG.info(
                "%s %s changed while it was scheduled (%s): released the claim on %s and "
                "leaving it be",
                self.kind.migration_type,
                migration.uuid,
                current.status,
                dest.host,
                extra=self._extra(),
            )
            return None
        LOG.info(
            "moving instance %s from %s to %s (node %s): %s %s",
            migration.instance_uuid,
            migration.source_compute,
            dest.host,
            dest.hypervisor_hostname,
            self.kind.migration_type,
            migration.uuid,
            extra={**self._extra(), "decision": "move_destination"},
        )
        return await self._recorded_destination(current)

    async def _recorded_destination(self, migration: Migration) -> HostState:
        assert migration.dest_compute_id is not None
        async with self.pool.acquire() as conn:
            try:
                return await compute_nodes.host_state_by_id(
                    conn, migration.dest_compute_id, self.service_down_time
                )
            except ComputeNodeNotFound:
                raise BuildFailed(
                    f"the destination node {migration.dest_compute_id} no longer exists"
                ) from None

    async def _send_build(
        self, instance: Instance, destination: HostState, source_disk: GuestDisk | None = None
    ) -> None:
        async with self.pool.acquire() as conn:
            addresses = await fixed_ips.for_instance(conn, instance.uuid)
            boot = None
            if self.boot_images is not None:
                boot = await self.boot_images.source(conn, instance.image_ref)
        if self.migration is not None and self.migration.new_flavor is not None:
            instance = instance.model_copy(update={"flavor": self.migration.new_flavor})
        spec = instance_spec(
            instance,
            destination.node.hypervisor_hostname,
            list(addresses),
            boot,
            origin=self.migration_uuid,
        )
        in_place = (
            self.migration is not None and self.migration.source_compute_id == destination.node.id
        )
        try:
            await self.compute.rebuild_instance(
                self.ctx,
                destination.service.uuid,
                spec,
                self.migration_uuid,
                powered_off=(
                    instance.vm_state == VmState.STOPPED
                    or (self.migration is not None and self.migration.end_stopped)
                ),
                source_disk=None if in_place else source_disk,
                in_place=in_place,
            )
        except Unroutable as exc:
            raise BuildFailed(
                f"compute host {destination.node.host} has no queue on the broker ({exc.message})"
            ) from None
        LOG.info(
            "asked host %s to %s instance %s for %s %s",
            destination.node.host,
            "resize in place" if in_place else "build",
            instance.uuid,
            self.kind.migration_type,
            self.migration_uuid,
            extra={**self._extra(), "decision": "move_build_sent"},
        )

    async def _give_up(self, status: MigrationStatus, message: str) -> None:
        """End the move as ``status``; the instance stays on its source."""
        kind = self.kind
        async with self.pool.acquire() as conn, conn.transaction():
            await moves.lock(conn, self.migration_uuid)
            ended = await moves.swap_status(
                conn, self.migration_uuid, expected=list(UNDER_WAY), new=status
            )
            if ended is None:
                return
            released = await allocations.release_consumer(conn, self.migration_uuid)
            tasks = (kind.choosing, kind.building)
            if kind.no_host_is_error or status != MigrationStatus.ERROR:
                for task in dict.fromkeys(tasks):
                    await instances.fail_task(conn, ended.instance_uuid, task, message=message)
            else:
                await instances.finish_task(conn, ended.instance_uuid, tasks)
            await instance_actions.finish(conn, ended.instance_uuid, kind.action, message)
        LOG.warning(
            "%s %s of instance %s is %s: %s (released %d claim(s); the instance stays on %s)",
            kind.migration_type,
            self.migration_uuid,
            ended.instance_uuid,
            status,
            message,
            len(released),
            ended.source_compute,
            extra={**self._extra(), "decision": f"move_{status}"},
        )

    async def rollback(self, exc: KeelError) -> None:
        if isinstance(exc, NoValidHost):
            await self._give_up(MigrationStatus.ERROR, exc.message)
            return
        await self._give_up(MigrationStatus.FAILED, f"The move failed: {exc.message}")
