"""The RPC endpoint of keel-compute, served on ``compute.<service uuid>``.

Both methods are casts, delivered at least once, so both are idempotent: a build of a
guest that already exists reports success again, a terminate of a guest that is gone
reports it deleted again. Operations on one guest run one at a time
(:class:`~services.compute.inflight.InFlight`). Results go back to the conductor, the
agent's only path to the database.
"""

from __future__ import annotations

import logging
from uuid import UUID

from services.compute.inflight import InFlight
from services.compute.rpcapi import BuildAndRunInstance, InstanceSpec, TerminateInstance
from services.compute.virt.driver import Driver
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.exceptions import KeelError

LOG = logging.getLogger(__name__)


def _extra(instance_uuid: UUID) -> dict[str, str]:
    return {"instance_uuid": str(instance_uuid)}


class ComputeManager:
    def __init__(self, driver: Driver, conductor: ConductorAPI) -> None:
        self._driver = driver
        self._conductor = conductor
        self._in_flight = InFlight()

    def in_flight(self) -> dict[UUID, str]:
        """Guest → the operation running on it now (what a stopping agent drains)."""
        return self._in_flight.operations()

    async def build_and_run_instance(self, ctx: RequestContext, req: BuildAndRunInstance) -> None:
        spec = req.instance
        async with self._in_flight.hold(spec.uuid, "build"):
            if spec.uuid in await self._driver.list_instances():
                LOG.info(
                    "guest %s already exists: the build was repeated; reporting success again",
                    spec.uuid,
                    extra=_extra(spec.uuid),
                )
                await self._conductor.instance_build_result(ctx, spec.uuid, success=True)
                return
            error = await self._spawn(spec)
            if error is not None:
                await self._conductor.instance_build_result(
                    ctx, spec.uuid, success=False, message=error
                )
                return
            LOG.info("guest %s is running", spec.uuid, extra=_extra(spec.uuid))
            await self._conductor.instance_build_result(ctx, spec.uuid, success=True)

    async def _spawn(self, spec: InstanceSpec) -> str | None:
        """Build the guest; on failure remove what was made and return why it failed."""
        flavor = spec.flavor
        LOG.info(
            "building guest %s (%s) with flavor %s: %d vCPU, %d MB RAM, %d GB disk",
            spec.uuid,
            spec.display_name,
            flavor.name,
            flavor.vcpus,
            flavor.memory_mb,
            flavor.root_gb,
            extra=_extra(spec.uuid),
        )
        try:
            await self._driver.spawn(spec)
        except KeelError as exc:
            message = exc.message
            LOG.warning("build of %s failed: %s", spec.uuid, message, extra=_extra(spec.uuid))
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            LOG.exception("build of %s failed unexpectedly", spec.uuid, extra=_extra(spec.uuid))
        else:
            return None
        await self._discard(spec.uuid)
        return message

    async def _discard(self, instance_uuid: UUID) -> None:
        """Remove what a failed build left; a failure here is logged, not raised."""
        try:
            await self._driver.destroy(instance_uuid)
        except Exception:
            LOG.exception(
                "could not remove what the failed build of %s left behind",
                instance_uuid,
                extra=_extra(instance_uuid),
            )
        else:
            LOG.info(
                "removed what the failed build of %s left behind",
                instance_uuid,
                extra=_extra(instance_uuid),
            )

    async def terminate_instance(self, ctx: RequestContext, req: TerminateInstance) -> None:
        instance_uuid = req.instance_uuid
        async with self._in_flight.hold(instance_uuid, "terminate"):
            existed = instance_uuid in await self._driver.list_instances()
            await self._driver.destroy(instance_uuid)
            if existed:
                LOG.info("guest %s destroyed", instance_uuid, extra=_extra(instance_uuid))
            else:
                LOG.info(
                    "guest %s does not exist on this host; reporting it deleted",
                    instance_uuid,
                    extra=_extra(instance_uuid),
                )
            await self._conductor.instance_deleted(ctx, instance_uuid)
