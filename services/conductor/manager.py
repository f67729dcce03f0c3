"""The conductor's RPC endpoint: one thin method per RPC of ``services.conductor.rpcapi``.

Workflows live in ``tasks/`` (the build) and ``moves/`` (evacuation, cold and live
migration), agent registration in ``registration.py``, what agents
report and ask about instances in ``instance_events.py``.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor import instance_events
from services.conductor.boot_images import BootImages
from services.conductor.builds.task import BuildInstanceTask
from services.conductor.guests import verdicts as guests
from services.conductor.live_rpc import (
    LiveDirective,
    LiveMigrateInstance,
    LiveMigrationProgress,
    LiveMigrationSwitch,
    LiveSwitch,
)
from services.conductor.moves import arrival, endings, live
from services.conductor.moves.task import MoveTask
from services.conductor.registration import ComputeRegistry
from services.conductor.rpcapi import (
    BuildCheck,
    BuildInstances,
    CheckBuild,
    CheckMove,
    ComputeResolution,
    ConfirmMigration,
    CopyRemoved,
    EvacuateInstance,
    EvacuationConfirmed,
    GuestsReport,
    InstanceActionResult,
    InstanceBuildResult,
    InstanceDeleted,
    MigrateInstance,
    MoveResult,
    PowerAction,
    RegisterCompute,
    Registration,
    ReportGuests,
    RequestTaken,
    ResizeInstance,
    ResolveCompute,
    RevertMigration,
    ServiceHeartbeat,
    TakeRequest,
    UnshelveInstance,
)
from services.conductor.shelving import Shelving, UnshelveTask
from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.faults import FaultPoints
from shared.metrics import Metrics
from shared.objects.states import VmState
from shared.version_pins import MinimumVersions

#: The results :class:`~services.conductor.shelving.Shelving` records.
SHELVE_RESULTS = (PowerAction.SHELVE, PowerAction.SHELVE_OFFLOAD, PowerAction.UNSHELVE)


class ConductorManager:
    """Served on the ``conductor`` topic; several may run at once as competing consumers."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        scheduler: SchedulerAPI,
        compute: ComputeAPI,
        *,
        service_down_time: float,
        faults: FaultPoints | None = None,
        minimums: MinimumVersions | None = None,
        boot_images: BootImages | None = None,
        same_host_resize: bool = False,
        fence_margin: float = 30.0,
        metrics: Metrics | None = None,
        shelved_offload_time: float = 0.0,
    ) -> None:
        self._pool = pool
        self._fence_margin = fence_margin
        self._metrics = metrics or Metrics()
        self._boot_images = boot_images
        self._same_host_resize = same_host_resize
        self._scheduler = scheduler
        self._compute = compute
        self._service_down_time = service_down_time
        self._faults = faults or FaultPoints()
        self._shelving = Shelving(
            pool,
            compute,
            offload_time=shelved_offload_time,
            service_down_time=service_down_time,
            faults=self._faults,
        )
        self._registry = ComputeRegistry(
            pool,
            service_down_time=service_down_time,
            minimums=minimums or MinimumVersions(pool, ttl=60.0),
        )

    async def build_instances(self, ctx: RequestContext, req: BuildInstances) -> None:
        task = BuildInstanceTask(
            ctx,
            req.instance_uuid,
            pool=self._pool,
            scheduler=self._scheduler,
            compute=self._compute,
            service_down_time=self._service_down_time,
            requested_destination=req.requested_destination,
            faults=self._faults,
            boot_images=self._boot_images,
        )
        await task.run()

    async def resolve_compute(self, ctx: RequestContext, req: ResolveCompute) -> ComputeResolution:
        return await self._registry.resolve(req)

    async def register_compute(self, ctx: RequestContext, req: RegisterCompute) -> Registration:
        return await self._registry.register(req)

    async def service_heartbeat(self, ctx: RequestContext, req: ServiceHeartbeat) -> None:
        await self._registry.heartbeat(req)

    async def instance_build_result(self, ctx: RequestContext, req: InstanceBuildResult) -> None:
        ended = await instance_events.record_build_result(self._pool, req)
        if ended is None:
            return
        active = ended.vm_state == VmState.ACTIVE
        self._metrics.boots.labels(result="active" if active else "error").inc()
        if active and ended.launched_at is not None:
            took = (ended.launched_at - ended.created_at).total_seconds()
            self._metrics.boot_seconds.observe(max(took, 0.0))

    async def take_request(self, ctx: RequestContext, req: TakeRequest) -> RequestTaken:
        return await instance_events.take_request(self._pool, req)

    async def instance_deleted(self, ctx: RequestContext, req: InstanceDeleted) -> None:
        await instance_events.record_deleted(self._pool, req.instance_uuid)

    async def instance_action_result(self, ctx: RequestContext, req: InstanceActionResult) -> None:
        if req.action in SHELVE_RESULTS:
            await self._shelving.record_result(ctx, req)
            return
        await instance_events.record_action_result(self._pool, req)

    async def unshelve_instance(self, ctx: RequestContext, req: UnshelveInstance) -> None:
        task = UnshelveTask(
            ctx,
            req.instance_uuid,
            pool=self._pool,
            scheduler=self._scheduler,
            compute=self._compute,
            service_down_time=self._service_down_time,
            requested_destination=req.requested_destination,
            faults=self._faults,
            boot_images=self._boot_images,
        )
        await task.run()

    async def check_build(self, ctx: RequestContext, req: CheckBuild) -> BuildCheck:
        return await instance_events.check_build(self._pool, req)

    async def evacuate_instance(self, ctx: RequestContext, req: EvacuateInstance) -> None:
        await self._move(ctx, req.migration_uuid)

    async def resize_instance(self, ctx: RequestContext, req: ResizeInstance) -> None:
        await self._move(ctx, req.migration_uuid)

    async def migrate_instance(self, ctx: RequestContext, req: MigrateInstance) -> None:
        await self._move(ctx, req.migration_uuid)

    async def _move(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        task = MoveTask(
            ctx,
            migration_uuid,
            pool=self._pool,
            scheduler=self._scheduler,
            compute=self._compute,
            service_down_time=self._service_down_time,
            faults=self._faults,
            boot_images=self._boot_images,
            same_host_resize=self._same_host_resize,
            fence_margin=self._fence_margin,
        )
        await task.run()

    async def live_migrate_instance(self, ctx: RequestContext, req: LiveMigrateInstance) -> None:
        task = live.LiveMoveTask(
            ctx,
            req.migration_uuid,
            pool=self._pool,
            scheduler=self._scheduler,
            compute=self._compute,
            service_down_time=self._service_down_time,
            faults=self._faults,
            boot_images=self._boot_images,
            fence_margin=self._fence_margin,
        )
        await task.run()

    async def live_migration_progress(
        self, ctx: RequestContext, req: LiveMigrationProgress
    ) -> LiveDirective:
        return await live.progress(self._pool, req)

    async def live_migration_switch(
        self, ctx: RequestContext, req: LiveMigrationSwitch
    ) -> LiveSwitch:
        return await live.switch(
            self._pool,
            self._compute,
            req,
            down_time=self._service_down_time,
            boot_images=self._boot_images,
        )

    async def check_move(self, ctx: RequestContext, req: CheckMove) -> BuildCheck:
        return await arrival.check_move(self._pool, req)

    async def move_result(self, ctx: RequestContext, req: MoveResult) -> None:
        await arrival.record_move_result(self._pool, self._compute, req, self._service_down_time)

    async def report_guests(self, ctx: RequestContext, req: ReportGuests) -> GuestsReport:
        return await guests.report_guests(self._pool, req, self._service_down_time)

    async def evacuation_confirmed(self, ctx: RequestContext, req: EvacuationConfirmed) -> None:
        await endings.confirm_evacuation(self._pool, req)

    async def confirm_migration(self, ctx: RequestContext, req: ConfirmMigration) -> None:
        await endings.confirm(
            self._pool,
            self._compute,
            req.migration_uuid,
            self._service_down_time,
            faults=self._faults,
        )

    async def revert_migration(self, ctx: RequestContext, req: RevertMigration) -> None:
        await endings.revert(self._pool, self._compute, req.migration_uuid, self._service_down_time)

    async def copy_removed(self, ctx: RequestContext, req: CopyRemoved) -> None:
        await endings.copy_removed(self._pool, self._compute, req, self._service_down_time)
