"""The virt driver protocol: what keel-compute asks of the hypervisor it manages.

A driver knows guests only by instance UUID. Every method may be called again for the
same guest (casts are delivered at least once), so ``spawn`` of a guest that exists and
``destroy`` of one that does not are both quiet successes. Drivers do blocking work in
``asyncio.to_thread`` so one slow disk never stalls heartbeats.

Two drivers exist: :mod:`~services.compute.virt.local` (each guest a directory in the
state dir; the default) and :mod:`~services.compute.virt.fake` (in memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol
from uuid import UUID

from pydantic import Field

from services.compute.rpcapi import GuestDiagnostics, GuestDisk, InstanceSpec
from shared.objects.base import KeelModel
from shared.objects.flavor import FlavorSnapshot
from shared.objects.states import PowerState

#: The most of a console log a driver returns: its last 100 KiB, as Nova's libvirt
#: driver keeps.
MAX_CONSOLE_BYTES = 100 * 1024


class HypervisorResources(KeelModel):
    """The hypervisor's totals as the driver sees them, before allocation ratios."""

    vcpus: int = Field(ge=0)
    memory_mb: int = Field(ge=0)
    local_gb: int = Field(ge=0)
    running_vms: int = Field(default=0, ge=0)


class Driver(Protocol):
    def hypervisor_hostname(self) -> str:
        """The name of the hypervisor node this driver manages."""
        ...

    async def init_host(self, node_uuid: UUID) -> None:
        """Prepare the host at agent start-up (e.g. clear what a crash left half-done).

        ``node_uuid`` is this agent's compute node: a driver whose hypervisor may be
        shared by several agents marks its guests with it.
        """
        ...

    async def open_node(self, node_uuid: UUID) -> None:
        """Watch node ``node_uuid``'s guests without changing anything on the host (what
        a host fence does beside a running agent, instead of :meth:`init_host`)."""
        ...

    async def resources(self) -> HypervisorResources:
        """Current totals and the number of guests present."""
        ...

    async def spawn(self, spec: InstanceSpec) -> None:
        """Create and start the guest; nothing happens if it already exists.

        On failure the driver raises; whatever it created may remain and is removed by
        :meth:`destroy`.
        """
        ...

    async def rebuild(self, spec: InstanceSpec, *, source_disk: GuestDisk | None = None) -> None:
        """Build the guest anew on this host from its spec (a move's destination).

        Like :meth:`spawn`: nothing happens if it already exists here. With
        ``source_disk`` (a cold migration), the guest's disk is a copy of that one.
        """
        ...

    async def migration_disk(self, instance_uuid: UUID) -> GuestDisk | None:
        """Where the (stopped) guest's disk can be copied from; ``None`` if nothing to copy."""
        ...

    async def snapshot(self, instance_uuid: UUID, target: Path, disk_format: str) -> None:
        """Write the guest's disk, as it is now, to the new file ``target`` in
        ``disk_format`` (``qcow2`` or ``raw``); the guest's power state is as it was after.
        Raises :class:`~shared.exceptions.GuestNotFound` if the guest is not here."""
        ...

    async def resize(self, instance_uuid: UUID, flavor: FlavorSnapshot) -> None:
        """Give the existing (shut down) guest ``flavor``'s size, in place: a resize on its
        own host, or its revert. Its data and origin stay. GuestNotFound if it is missing.
        """
        ...

    async def destroy(self, instance_uuid: UUID) -> None:
        """Remove the guest and everything it left behind; a missing guest is fine."""
        ...

    async def list_instances(self) -> list[UUID]:
        """The guests that exist on this hypervisor."""
        ...

    async def origin(self, instance_uuid: UUID) -> UUID | None:
        """The move the guest was built for (its spec's ``origin``; ``None``: a first
        build, or a guest from before origins were kept). GuestNotFound if missing."""
        ...

    async def guest_power(self, instance_uuid: UUID) -> PowerState:
        """The guest's power state (RUNNING or SHUTDOWN...); GuestNotFound if missing."""
        ...

    async def power_off(self, instance_uuid: UUID) -> None:
        """Shut the guest down; one already off stays off. GuestNotFound if it is missing."""
        ...

    async def halt(self, instance_uuid: UUID) -> None:
        """Power the guest off at once, as pulling its plug (a host fence's power-off:
        no clean shutdown is waited for); its disk stays. GuestNotFound if missing."""
        ...

    async def power_on(self, instance_uuid: UUID) -> None:
        """Start the guest; one already running keeps running. GuestNotFound if missing."""
        ...

    async def reboot(self, instance_uuid: UUID, *, hard: bool) -> None:
        """Restart the guest (a hard reboot also starts one that was off)."""
        ...

    async def pause(self, instance_uuid: UUID) -> None:
        """Stop the guest's vCPUs, keeping its memory; one already paused stays paused."""
        ...

    async def unpause(self, instance_uuid: UUID) -> None:
        """Let a paused guest run again; one already running keeps running."""
        ...

    async def suspend(self, instance_uuid: UUID) -> None:
        """Save the guest's memory to disk and stop it; one already suspended stays so."""
        ...

    async def resume(self, instance_uuid: UUID) -> None:
        """Start a suspended guest from its saved memory; one running keeps running."""
        ...

    async def console_output(self, instance_uuid: UUID) -> bytes:
        """The end of the guest's console log (at most :data:`MAX_CONSOLE_BYTES`).

        GuestNotFound if the guest is missing; ConsoleNotAvailable if its log cannot be
        read. A guest that has printed nothing yet has an empty log.
        """
        ...

    async def diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        """What the driver knows of the guest (state, vCPUs, memory, NICs, disks, uptime);
        GuestNotFound if it is missing."""
        ...
