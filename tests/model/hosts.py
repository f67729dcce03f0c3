"""Compute hosts of the model: a disk that outlives its agent, and a driver that is watched.

A :class:`Host` is the machine: its name (changed by ``service rename``), its state
directory (the node identity file), its power, its hypervisor — a :class:`ModelDriver`
that lives as long as the host, so guests survive the agent's kill and restart as they
survive keel-compute's on a real host — and the lease its agent and its fence share (in
memory, on the model's clock). A crash (power loss) stops every guest but keeps them on
disk, and begins a new boot (a lease of the last one guards nothing).

The driver reports every destroy of an existing guest — with the copy token it carries
— to the world before doing it, so invariant I3 (a copy keel still needs is never
destroyed) is judged against the database at that very moment. A spawn or rebuild the
model makes fail creates nothing, so nothing it leaves is exempt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

from services.compute.rpcapi import GuestDisk, InstanceSpec
from services.compute.virt.fake import FakeDriver
from services.fence.api import Clock, MemoryLeaseStore
from shared.exceptions import KeelError

#: ``on_destroy(host, instance_uuid, copy_token)``, awaited before a guest goes.
DestroyWatch = Callable[["Host", UUID, UUID | None], Awaitable[None]]

#: Sizes of every model host: room for three servers of the model's flavor.
VCPUS = 4
MEMORY_MB = 1536
LOCAL_GB = 40


class InjectedFailure(KeelError):
    """A driver operation the model made fail."""


class ModelDriver(FakeDriver):
    def __init__(self, host: Host, on_destroy: DestroyWatch) -> None:
        super().__init__(host.hypervisor, vcpus=VCPUS, memory_mb=MEMORY_MB, local_gb=LOCAL_GB)
        self._host = host
        self._on_destroy = on_destroy
        #: Operations ("spawn", "rebuild"; "destroy" in scripted examples) that fail the
        #: next time they are asked for.
        self.fail_next: set[str] = set()

    async def init_host(self, node_uuid: UUID) -> None:
        """The guests stay: a model host keeps its disk across agent restarts."""

    async def spawn(self, spec: InstanceSpec) -> None:
        await self._maybe_fail("spawn", spec.uuid)
        await super().spawn(spec)

    async def rebuild(self, spec: InstanceSpec, *, source_disk: GuestDisk | None = None) -> None:
        await self._maybe_fail("rebuild", spec.uuid)
        await super().spawn(spec)

    async def _maybe_fail(self, operation: str, instance_uuid: UUID) -> None:
        if operation in self.fail_next and instance_uuid not in self._guests:
            self.fail_next.discard(operation)
            raise InjectedFailure(f"{operation} of {instance_uuid} failed (injected)")

    async def destroy(self, instance_uuid: UUID) -> None:
        if "destroy" in self.fail_next and instance_uuid in self._guests:
            self.fail_next.discard("destroy")
            raise InjectedFailure(f"destroy of {instance_uuid} failed (injected)")
        guest = self._guests.get(instance_uuid)
        if guest is not None:
            await self._on_destroy(self._host, instance_uuid, guest.origin)
        await super().destroy(instance_uuid)

    def power_loss(self) -> None:
        """The machine lost power: every guest is stopped, none is gone."""
        self._running.clear()
        self._paused.clear()
        self._suspended.clear()

    def guests(self) -> set[UUID]:
        return set(self._guests)

    def running(self) -> set[UUID]:
        return set(self._running) & set(self._guests)


@dataclass(eq=False)
class Host:
    index: int
    name: str
    state_dir: Path
    #: The hypervisor's node name: never changes (a host rename keeps its node).
    hypervisor: str
    driver: ModelDriver = field(init=False)
    #: False after a crash, until the host is started again.
    powered: bool = True
    #: The node UUID the agent registered (None before its first start).
    node_uuid: UUID | None = None
    #: Set once the service was deleted: the host is gone for good.
    gone: bool = False
    #: While the host is cut off from the control plane: the seconds it has been;
    #: ``None`` when it is not.
    cut_for: float | None = None
    #: The agent's lease and the fence's status (see :mod:`services.fence.api`).
    lease: MemoryLeaseStore = field(init=False)
    boots: int = 0

    def attach(self, on_destroy: DestroyWatch, clock: Clock) -> None:
        self.driver = ModelDriver(self, on_destroy)
        self.lease = MemoryLeaseStore(clock=clock, boot=f"{self.hypervisor}-boot0")

    def reboot(self) -> None:
        """Power comes back: a new boot, whose fence ignores the old boot's lease."""
        self.boots += 1
        self.lease.boot = f"{self.hypervisor}-boot{self.boots}"
