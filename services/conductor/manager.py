"""The conductor's RPC endpoint: one thin method per RPC of ``services.conductor.rpcapi``.

Workflows live in ``tasks/``, agent registration in ``registration.py``, what agents
report and ask about instances in ``instance_events.py``.
"""

from __future__ import annotations

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor import evacuations, instance_events
from services.conductor.registration import ComputeRegistry
from services.conductor.rpcapi import (
    BuildCheck,
    BuildInstances,
    CheckBuild,
    ComputeResolution,
    EvacuateInstance,
    EvacuationConfirmed,
    GuestsReport,
    InstanceActionResult,
    InstanceBuildResult,
    InstanceDeleted,
    MoveResult,
    RegisterCompute,
    Registration,
    ReportGuests,
    ResolveCompute,
    ServiceHeartbeat,
)
from services.conductor.tasks.build import BuildInstanceTask
from services.conductor.tasks.move import MoveTask
from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.faults import FaultPoints
from shared.version_pins import MinimumVersions


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
    ) -> None:
        self._pool = pool
        self._scheduler = scheduler
        self._compute = compute
        self._service_down_time = service_down_time
        self._faults = faults or FaultPoints()
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
            faults=self._faults,
        )
        await task.run()

    async def resolve_compute(self, ctx: RequestContext, req: ResolveCompute) -> ComputeResolution:
        return await self._registry.resolve(req)

    async def register_compute(self, ctx: RequestContext, req: RegisterCompute) -> Registration:
        return await self._registry.register(req)

    async def service_heartbeat(self, ctx: RequestContext, req: ServiceHeartbeat) -> None:
        await self._registry.heartbeat(req)

    async def instance_build_result(self, ctx: RequestContext, req: InstanceBuildResult) -> None:
        await instance_events.record_build_result(self._pool, req)

    async def instance_deleted(self, ctx: RequestContext, req: InstanceDeleted) -> None:
        await instance_events.record_deleted(self._pool, req.instance_uuid)

    async def instance_action_result(self, ctx: RequestContext, req: InstanceActionResult) -> None:
        await instance_events.record_action_result(self._pool, req)

    async def check_build(self, ctx: RequestContext, req: CheckBuild) -> BuildCheck:
        return await instance_events.check_build(self._pool, req)

    async def evacuate_instance(self, ctx: RequestContext, req: EvacuateInstance) -> None:
        task = MoveTask(
            ctx,
            req.migration_uuid,
            pool=self._pool,
            scheduler=self._scheduler,
            compute=self._compute,
            service_down_time=self._service_down_time,
        )
        await task.run()

    async def move_result(self, ctx: RequestContext, req: MoveResult) -> None:
        await evacuations.record_move_result(
            self._pool, self._compute, req, self._service_down_time
        )

    async def report_guests(self, ctx: RequestContext, req: ReportGuests) -> GuestsReport:
        return await evacuations.report_guests(self._pool, req)

    async def evacuation_confirmed(self, ctx: RequestContext, req: EvacuationConfirmed) -> None:
        await evacuations.confirm_evacuation(self._pool, req)
