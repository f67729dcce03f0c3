"""An in-memory virt driver: guests are entries in a dict.

Used by unit tests and by scale tests that run many agents in one machine: it has the
sizes it is given, takes ``spawn_delay`` seconds to build a guest, and touches nothing
outside the process. Each guest's console log is kept in memory: ``keel-guest-up
<uuid>`` at every boot (spawn, power on, reboot), a line at every power-off.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from uuid import UUID

from services.compute.rpcapi import GuestDiagnostics, GuestDisk, InstanceSpec
from services.compute.virt.console import boot_banner, stamped, up_line
from services.compute.virt.diagnostics import simulated
from services.compute.virt.driver import MAX_CONSOLE_BYTES, HypervisorResources
from shared.exceptions import GuestNotFound
from shared.objects.flavor import FlavorSnapshot
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)


class FakeDriver:
    DEFAULT_VCPUS = 64
    DEFAULT_MEMORY_MB = 256 * 1024
    DEFAULT_LOCAL_GB = 4096

    def __init__(
        self,
        hostname: str,
        *,
        vcpus: int = DEFAULT_VCPUS,
        memory_mb: int = DEFAULT_MEMORY_MB,
        local_gb: int = DEFAULT_LOCAL_GB,
        spawn_delay: float = 0.0,
    ) -> None:
        self._hostname = hostname
        self._totals = HypervisorResources(vcpus=vcpus, memory_mb=memory_mb, local_gb=local_gb)
        self.spawn_delay = spawn_delay
        self._guests: dict[UUID, InstanceSpec] = {}
        self._running: set[UUID] = set()
        #: Guests whose vCPUs are stopped, and guests whose memory is saved.
        self._paused: set[UUID] = set()
        self._suspended: set[UUID] = set()
        self._consoles: dict[UUID, str] = {}

    def hypervisor_hostname(self) -> str:
        return self._hostname

    async def init_host(self, node_uuid: UUID) -> None:
        LOG.info("fake driver: %s starts with no guests", self._hostname)

    async def open_node(self, node_uuid: UUID) -> None:
        """Nothing to open: the guests are this object's."""

    async def resources(self) -> HypervisorResources:
        return self._totals.model_copy(update={"running_vms": len(self._guests)})

    async def spawn(self, spec: InstanceSpec) -> None:
        if spec.uuid in self._guests:
            return
        if self.spawn_delay:
            await asyncio.sleep(self.spawn_delay)
        if spec.uuid in self._guests:
            return
        self._guests[spec.uuid] = spec
        self._consoles[spec.uuid] = boot_banner(spec, self._hostname)
        self._running.add(spec.uuid)

    async def rebuild(self, spec: InstanceSpec, *, source_disk: GuestDisk | None = None) -> None:
        await self.spawn(spec)

    async def migration_disk(self, instance_uuid: UUID) -> GuestDisk | None:
        return None

    async def snapshot(self, instance_uuid: UUID, target: Path, disk_format: str) -> None:
        """A small deterministic disk: the guest's id and image, and a fixed pattern."""
        spec = self._guests[self._existing(instance_uuid)]
        await asyncio.to_thread(target.write_bytes, fake_disk(spec))

    async def destroy(self, instance_uuid: UUID) -> None:
        self._guests.pop(instance_uuid, None)
        self._running.discard(instance_uuid)
        self._paused.discard(instance_uuid)
        self._suspended.discard(instance_uuid)
        self._consoles.pop(instance_uuid, None)

    def _boot(self, instance_uuid: UUID) -> None:
        self._paused.discard(instance_uuid)
        self._suspended.discard(instance_uuid)
        self._running.add(instance_uuid)
        self._consoles[instance_uuid] += stamped(up_line(instance_uuid))

    def _existing(self, instance_uuid: UUID) -> UUID:
        if instance_uuid not in self._guests:
            raise GuestNotFound(f"guest {instance_uuid} does not exist on {self._hostname}")
        return instance_uuid

    async def resize(self, instance_uuid: UUID, flavor: FlavorSnapshot) -> None:
        spec = self._guests[self._existing(instance_uuid)]
        self._guests[instance_uuid] = spec.model_copy(update={"flavor": flavor})

    async def origin(self, instance_uuid: UUID) -> UUID | None:
        return self._guests[self._existing(instance_uuid)].origin

    async def guest_power(self, instance_uuid: UUID) -> PowerState:
        guest = self._existing(instance_uuid)
        if guest in self._paused:
            return PowerState.PAUSED
        if guest in self._suspended:
            return PowerState.SUSPENDED
        return PowerState.RUNNING if guest in self._running else PowerState.SHUTDOWN

    async def power_off(self, instance_uuid: UUID) -> None:
        if self._existing(instance_uuid) in self._running:
            self._running.discard(instance_uuid)
            self._consoles[instance_uuid] += stamped("powered off")

    async def halt(self, instance_uuid: UUID) -> None:
        await self.power_off(instance_uuid)

    async def power_on(self, instance_uuid: UUID) -> None:
        if self._existing(instance_uuid) not in self._running:
            self._boot(instance_uuid)

    async def pause(self, instance_uuid: UUID) -> None:
        if self._existing(instance_uuid) in self._running:
            self._running.discard(instance_uuid)
            self._paused.add(instance_uuid)
            self._consoles[instance_uuid] += stamped("paused")

    async def unpause(self, instance_uuid: UUID) -> None:
        if self._existing(instance_uuid) in self._paused:
            self._paused.discard(instance_uuid)
            self._running.add(instance_uuid)
            self._consoles[instance_uuid] += stamped("unpaused")

    async def suspend(self, instance_uuid: UUID) -> None:
        if self._existing(instance_uuid) in self._running | self._paused:
            self._running.discard(instance_uuid)
            self._paused.discard(instance_uuid)
            self._suspended.add(instance_uuid)
            self._consoles[instance_uuid] += stamped("suspended: memory saved")

    async def resume(self, instance_uuid: UUID) -> None:
        if self._existing(instance_uuid) in self._suspended:
            self._suspended.discard(instance_uuid)
            self._running.add(instance_uuid)
            self._consoles[instance_uuid] += stamped("resumed from its saved memory")

    def is_paused(self, instance_uuid: UUID) -> bool:
        return instance_uuid in self._paused

    def is_suspended(self, instance_uuid: UUID) -> bool:
        return instance_uuid in self._suspended

    async def reboot(self, instance_uuid: UUID, *, hard: bool) -> None:
        self._existing(instance_uuid)
        if hard or instance_uuid in self._running:
            self._consoles[instance_uuid] += stamped(f"{'hard' if hard else 'soft'} reboot")
            self._boot(instance_uuid)

    async def diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        spec = self._guests[self._existing(instance_uuid)]
        if instance_uuid in self._suspended:
            state = "suspended"
        elif instance_uuid in self._paused:
            state = "paused"
        else:
            state = "running" if instance_uuid in self._running else "shutdown"
        return simulated(spec, state=state, hypervisor="fake", uptime=None)

    async def console_output(self, instance_uuid: UUID) -> bytes:
        log = self._consoles[self._existing(instance_uuid)].encode()
        return log[-MAX_CONSOLE_BYTES:]

    def is_running(self, instance_uuid: UUID) -> bool:
        return instance_uuid in self._running

    async def list_instances(self) -> list[UUID]:
        return list(self._guests)

    def guest(self, instance_uuid: UUID) -> InstanceSpec | None:
        """The spec a guest was built from, or ``None`` if it does not exist."""
        return self._guests.get(instance_uuid)


def fake_disk(spec: InstanceSpec) -> bytes:
    """What the fake driver's snapshot of a guest holds (64 KiB, always the same)."""
    head = f"keel fake disk of {spec.uuid} from image {spec.image_ref}\n".encode()
    return (head + bytes(range(256)) * 256)[: 64 * 1024]
