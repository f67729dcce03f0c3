"""Host fences in the model: keel-fence as a process of its own, on the model's clock.

Each host's fence is the real :class:`~services.fence.guard.HostFence`, run as a model
:class:`~tests.model.runtime.Process` of its own (``keel-fence@host``): killing the
agent leaves it running, a crash of the host kills it, and the agent starts it again
when it finds it gone (:class:`ModelLauncher`). It keeps no timer: it looks whenever
its lease is written, and whenever the model lets time pass
(:meth:`~tests.model.world.World.advance` wakes every fence), so a lease runs out and
the fence fires when the model's clock says so, never when a step's wall time does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.fence.guard import HostFence
from tests.model.hosts import Host
from tests.model.runtime import Process

if TYPE_CHECKING:
    from tests.model.world import World


class ModelLauncher:
    """What an agent of the model starts its fence with."""

    def __init__(self, world: World, host: Host) -> None:
        self._world = world
        self._host = host

    def start(self) -> None:
        start_fence(self._world, self._host)

    def starting(self) -> bool:
        return False

    def stop(self) -> None:
        """The agent stops or dies: its fence runs on."""


def start_fence(world: World, host: Host) -> Process:
    """Start ``host``'s fence (if none runs): a process of its own."""
    process = world.fences.get(host.index)
    if process is not None and process.alive:
        return process
    process = Process(world.rt, f"keel-fence@{host.name}")
    process.alive = True
    world.fences[host.index] = process
    store = host.lease
    store.fence_running = True
    fence = HostFence(host.driver, store, record_dir=None)

    async def guard() -> None:
        try:
            await fence.run(interval=None)
        finally:
            if world.fences.get(host.index) is process:
                store.fence_running = False
                process.alive = False

    async def dead() -> None:
        if world.fences.get(host.index) is process:
            store.fence_running = False

    process.on_kill = dead
    process.spawn(guard(), "fence")
    return process


def wake_fences(world: World) -> None:
    """Time passed: every fence looks at its lease."""
    for host in world.hosts:
        process = world.fences.get(host.index)
        if process is not None and process.alive:
            host.lease.changed().set()
