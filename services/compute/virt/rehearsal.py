"""A driver wrapper for tests and rehearsals: guest operations that are slow or fail.

``KEEL_VIRT__FAIL_OPERATIONS`` names operations (``spawn``, ``rebuild``, ``destroy``,
``power_off``, ``power_on``, ``reboot``, ``snapshot``...) that raise instead of running, and
``KEEL_VIRT__DELAY_S`` makes every guest operation take that many seconds first. Both
are for rehearsing failures (an evacuation whose destination cannot rebuild, a source
host returning while the rebuild is still under way); never set them in production.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from uuid import UUID

from services.compute.rpcapi import GuestDiagnostics, GuestDisk, InstanceSpec
from services.compute.virt.driver import Driver, HypervisorResources
from shared.config import VIRT_OPERATIONS
from shared.exceptions import BuildFailed
from shared.objects.flavor import FlavorSnapshot
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)


class RehearsalDriver:
    """Wraps a real driver; delays and fails the operations it is told to."""

    def __init__(self, driver: Driver, *, fail: frozenset[str], delay: float) -> None:
        unknown = fail - VIRT_OPERATIONS
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}")
        self._driver = driver
        self.fail = fail
        self.delay = delay
        if fail or delay:
            LOG.warning(
                "rehearsal settings in force: failing %s, every guest operation delayed %gs",
                ", ".join(sorted(fail)) or "nothing",
                delay,
            )

    async def _rehearse(self, operation: str, instance_uuid: UUID) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        if operation in self.fail:
            raise BuildFailed(
                f"{operation} of guest {instance_uuid} failed on purpose "
                "(KEEL_VIRT__FAIL_OPERATIONS)"
            )

    def hypervisor_hostname(self) -> str:
        return self._driver.hypervisor_hostname()

    async def init_host(self, node_uuid: UUID) -> None:
        await self._driver.init_host(node_uuid)

    async def open_node(self, node_uuid: UUID) -> None:
        await self._driver.open_node(node_uuid)

    async def resources(self) -> HypervisorResources:
        return await self._driver.resources()

    async def list_instances(self) -> list[UUID]:
        return await self._driver.list_instances()

    async def resize(self, instance_uuid: UUID, flavor: FlavorSnapshot) -> None:
        await self._driver.resize(instance_uuid, flavor)

    async def origin(self, instance_uuid: UUID) -> UUID | None:
        return await self._driver.origin(instance_uuid)

    async def guest_power(self, instance_uuid: UUID) -> PowerState:
        return await self._driver.guest_power(instance_uuid)

    async def spawn(self, spec: InstanceSpec) -> None:
        await self._rehearse("spawn", spec.uuid)
        await self._driver.spawn(spec)

    async def rebuild(self, spec: InstanceSpec, *, source_disk: GuestDisk | None = None) -> None:
        await self._rehearse("rebuild", spec.uuid)
        await self._driver.rebuild(spec, source_disk=source_disk)

    async def migration_disk(self, instance_uuid: UUID) -> GuestDisk | None:
        return await self._driver.migration_disk(instance_uuid)

    async def snapshot(self, instance_uuid: UUID, target: Path, disk_format: str) -> None:
        await self._rehearse("snapshot", instance_uuid)
        await self._driver.snapshot(instance_uuid, target, disk_format)

    async def destroy(self, instance_uuid: UUID) -> None:
        await self._rehearse("destroy", instance_uuid)
        await self._driver.destroy(instance_uuid)

    async def power_off(self, instance_uuid: UUID) -> None:
        await self._rehearse("power_off", instance_uuid)
        await self._driver.power_off(instance_uuid)

    async def halt(self, instance_uuid: UUID) -> None:
        await self._driver.halt(instance_uuid)

    async def power_on(self, instance_uuid: UUID) -> None:
        await self._rehearse("power_on", instance_uuid)
        await self._driver.power_on(instance_uuid)

    async def pause(self, instance_uuid: UUID) -> None:
        await self._rehearse("pause", instance_uuid)
        await self._driver.pause(instance_uuid)

    async def unpause(self, instance_uuid: UUID) -> None:
        await self._rehearse("unpause", instance_uuid)
        await self._driver.unpause(instance_uuid)

    async def suspend(self, instance_uuid: UUID) -> None:
        await self._rehearse("suspend", instance_uuid)
        await self._driver.suspend(instance_uuid)

    async def resume(self, instance_uuid: UUID) -> None:
        await self._rehearse("resume", instance_uuid)
        await self._driver.resume(instance_uuid)

    async def reboot(self, instance_uuid: UUID, *, hard: bool) -> None:
        await self._rehearse("reboot", instance_uuid)
        await self._driver.reboot(instance_uuid, hard=hard)

    async def console_output(self, instance_uuid: UUID) -> bytes:
        return await self._driver.console_output(instance_uuid)

    async def diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        return await self._driver.diagnostics(instance_uuid)
