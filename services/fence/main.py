"""keel-fence: the host fence beside each keel-compute (console script ``keel-fence``).

Started by its agent whenever none runs (or by an init system: see
``deploy/keel-fence.service``), it reads the agent's settings (the same environment and
``--config`` file), holds ``fence.lock`` in the agent's state directory for as long as it
runs — a second fence started for the same host exits at once — and runs
:class:`~services.fence.guard.HostFence` until nothing is left to guard. It has no
broker or database connection and serves nothing: all it knows is the lease the agent
writes, and all it does is power guests off through the virt driver.

Optionally (``KEEL_FENCING__WATCHDOG_DEVICE``, e.g. ``/dev/watchdog``) it keeps the
host's hardware or kernel watchdog open and pets it at every look, so that a fence that
dies or hangs resets the whole host, as Proxmox VE's ``watchdog-mux`` does; a clean exit
disarms it. Never enable that on a machine you cannot afford to have reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from services.compute import identity
from services.compute.virt import base_driver
from services.fence.api import FENCE_LOCK, FileLeaseStore, HeldLock
from services.fence.guard import HostFence
from shared.config import Settings
from shared.exceptions import ConfigError
from shared.runtime import Lifecycle, run

LOG = logging.getLogger(__name__)


@contextlib.contextmanager
def watchdog_device(path: Path | None) -> Iterator[Callable[[], None] | None]:
    """Keep ``path`` (a watchdog device) open, yielding what pets it; closed with the magic
    character on the way out (the device then stands down). ``None``: no watchdog."""
    if path is None:
        yield None
        return
    fd = os.open(path, os.O_WRONLY)
    LOG.warning("holding the watchdog %s: if this fence dies or hangs, the host is reset", path)

    def pet() -> None:
        os.write(fd, b"\0")

    try:
        yield pet
    finally:
        with contextlib.suppress(OSError):
            os.write(fd, b"V")
        os.close(fd)


async def guard(settings: Settings, lifecycle: Lifecycle) -> None:
    """Run the fence of ``settings.state_dir``'s host until nothing is left to guard."""
    if settings.self_fence_after <= 0:
        LOG.info("fencing is switched off (KEEL_FENCING__SELF_FENCE_AFTER=0): nothing to do")
        return
    state_dir = settings.state_dir
    lock = HeldLock(state_dir / FENCE_LOCK)
    if not await asyncio.to_thread(lock.acquire):
        LOG.info("another keel-fence guards %s already; exiting", state_dir)
        return
    try:
        found = await asyncio.to_thread(identity.read_identity, state_dir, settings.config_file)
        if found.node_uuid is None:
            raise ConfigError(
                f"no node identity in {state_dir}: keel-fence guards a host whose agent has "
                "registered (start keel-compute, which starts its fence)"
            )
        driver = base_driver(settings)
        await driver.open_node(found.node_uuid)
        store = FileLeaseStore(state_dir)
        with watchdog_device(settings.fencing.watchdog_device) as pet:
            fence = HostFence(driver, store, record_dir=state_dir, watchdog=pet)
            LOG.info(
                "keel-fence guarding node %s (state directory %s; lease %gs)",
                found.node_uuid,
                state_dir,
                settings.self_fence_after,
            )
            await fence.run(lifecycle.stopping)
    finally:
        lock.release()


def main(argv: Sequence[str] | None = None) -> None:
    run(
        "keel-fence",
        guard,
        argv,
        description="The fence of a compute host: powers its guests off when the agent's "
        "lease runs out.",
    )


if __name__ == "__main__":
    main()
