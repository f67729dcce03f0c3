"""The agent's side of its host's fence: keep one running, renew its lease, know if it is armed.

keel-compute never fences anything itself (it may be the process that died): a
separate keel-fence per host does (:mod:`services.fence.guard`). The agent

* **makes sure its fence runs**: at start-up and at every look of its contact watch it
  starts one if none runs (:class:`ProcessLauncher`: ``keel-fence`` in a session of its
  own, so that neither the agent's death nor a Ctrl-C of its terminal takes it along),
  however the agent itself was started;
* **renews the lease** after every heartbeat the control plane answered, by the lease's
  length counted from when that heartbeat was *sent* (so the lease ends no later than
  its length after the heartbeat the database recorded), and writes when it last
  reconciled its guests (what lifts a fencing);
* **says whether the fence is armed** — running, looking, and enforcing this agent's
  lease — in every heartbeat (``fence_lease``): only then may the control plane count
  the host as fenced once the lease has run out. Without an armed fence it starts no
  guest (:meth:`armed`), unless fencing is switched off
  (``KEEL_FENCING__SELF_FENCE_AFTER=0``).

Guests of the fake driver live in the agent's own memory: their fence runs as a task of
the agent (:class:`TaskLauncher`), as it must to reach them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Protocol

from services.compute.virt.driver import Driver
from services.fence.api import (
    FenceStatus,
    FileLeaseStore,
    Lease,
    LeaseStore,
    MemoryLeaseStore,
)
from services.fence.guard import HostFence
from shared.config import Settings
from shared.metrics import Metrics

LOG = logging.getLogger(__name__)


#: Seconds a fence just started is given to take its lock and look once.
STARTING = 15.0


class FenceLauncher(Protocol):
    def start(self) -> None:
        """Start a fence for this host (one started beside another exits at once)."""
        ...

    def starting(self) -> bool:
        """Whether a fence it started is still starting (not yet given up on)."""
        ...

    def stop(self) -> None:
        """Forget what was started (the agent stops; a fence process outlives it)."""
        ...


class ProcessLauncher:
    """Starts ``keel-fence`` with the agent's settings, in a session of its own."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        #: The fences it started, and when (a fence takes a moment to take its lock).
        self._children: list[tuple[subprocess.Popen[bytes], float]] = []

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "services.fence.main"]
        if self._settings.config_file is not None:
            command += ["--config", str(self._settings.config_file)]
        return command

    def start(self) -> None:
        self._reap()
        env = dict(os.environ)
        # Settings given to this process in the environment reach the fence too; those
        # that name what only one process may have do not.
        env.pop("KEEL_METRICS_BIND", None)
        env["KEEL_STATE_DIR"] = str(self._settings.state_dir)
        env["KEEL_HOST"] = self._settings.host
        child = subprocess.Popen(
            self.command(),
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        self._children.append((child, time.monotonic()))

    def starting(self) -> bool:
        self._reap()
        now = time.monotonic()
        return any(now - began < STARTING for _, began in self._children)

    def _reap(self) -> None:
        self._children = [(c, began) for c, began in self._children if c.poll() is None]

    def stop(self) -> None:
        self._reap()


class TaskLauncher:
    """Runs the fence as a task of the agent: for guests that live in its memory."""

    def __init__(self, driver: Driver, store: LeaseStore) -> None:
        self._driver = driver
        self._store = store
        self._task: asyncio.Task[None] | None = None

    def starting(self) -> bool:
        return False

    def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        assert isinstance(self._store, MemoryLeaseStore)
        self._store.fence_running = True
        fence = HostFence(self._driver, self._store, record_dir=None)
        self._task = asyncio.get_running_loop().create_task(self._run(fence), name="keel-fence")

    async def _run(self, fence: HostFence) -> None:
        assert isinstance(self._store, MemoryLeaseStore)
        try:
            await fence.run()
        finally:
            self._store.fence_running = False

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class FenceLink:
    """See the module's text. ``length`` 0: fencing is switched off (no fence, no lease)."""

    def __init__(
        self,
        store: LeaseStore,
        launcher: FenceLauncher | None,
        *,
        length: float,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self._launcher = launcher
        self.length = length
        self._metrics = metrics
        self._reconciled_at: float | None = None
        self._expires_at: float | None = None
        #: How many times the fence had fired when last observed (its count restarts with
        #: a new fence process).
        self._fires_seen = 0
        self._started = 0
        #: Whether the agent knows its node (a fence guards a registered node only).
        self._active = False

    @property
    def enabled(self) -> bool:
        return self.length > 0 and self._launcher is not None

    # --- the fence process ----------------------------------------------------------------

    def begin(self) -> None:
        """The agent knows its node now: from here on, a fence must run."""
        self._active = True
        self.ensure()

    def ensure(self) -> bool:
        """Start a fence if none runs; True if one was started now."""
        if not self.enabled or not self._active or self.store.fence_alive():
            return False
        assert self._launcher is not None
        if self._launcher.starting():
            return False
        if self._started:
            LOG.error(
                "the host's fence is not running (or hung): starting it again; until it is "
                "armed this agent starts no guest and the host is not evacuated by time",
                extra={"decision": "fence_restarted"},
            )
        else:
            LOG.info("starting this host's fence (keel-fence)")
        self._started += 1
        self._launcher.start()
        return True

    def stop(self) -> None:
        if self._launcher is not None:
            self._launcher.stop()

    def status(self) -> FenceStatus | None:
        """The fence's last status, if it runs and looks (not dead, not hung)."""
        if not self.enabled or not self.store.fence_alive():
            return None
        return self.store.peek_status()

    def armed(self) -> bool:
        """Whether the fence runs and enforces this agent's lease (not fired)."""
        status = self.status()
        return status is not None and status.state == "armed" and status.length == self.length

    def fired(self) -> bool:
        status = self.status()
        return status is not None and status.state == "fired"

    def advertised(self) -> float | None:
        """What a heartbeat says of the fence: its lease if armed, else nothing."""
        return self.length if self.armed() else None

    def observe(self) -> None:
        """Bring the metrics up to date with the fence's status."""
        if self._metrics is None:
            return
        status = self.status()
        self._metrics.fence_armed.set(1 if self.armed() else 0)
        left = 0.0
        if status is not None and status.expires_at is not None:
            left = max(0.0, status.expires_at - self.store.now())
        self._metrics.fence_lease_left.set(left)
        if status is not None:
            if status.fires < self._fires_seen:
                self._fires_seen = 0  # a new fence: it counts from 0
            if status.fires > self._fires_seen:
                self._metrics.self_fences.inc(status.fires - self._fires_seen)
            self._fires_seen = status.fires

    # --- the lease ------------------------------------------------------------------------

    async def renew(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` was answered: the lease runs from then."""
        if not self.enabled:
            return
        self._expires_at = max(self._expires_at or sent_at, sent_at + self.length)
        await self._write()

    async def reconciled(self, started_at: float) -> None:
        """A guest report begun at ``started_at`` was answered and acted on."""
        if not self.enabled:
            return
        self._reconciled_at = started_at
        if self._expires_at is None:
            # No renewal from this agent yet: the lease its predecessor left runs on.
            lease = await self.store.read_lease()
            if lease is None or lease.boot != self.store.boot:
                return
            self._expires_at = lease.expires_at
        await self._write()

    async def release(self, *, guests_running: bool) -> None:
        """The agent stops cleanly: with no guest running, the fence may go too."""
        if not self.enabled or guests_running or self._expires_at is None:
            return
        await self._write(released=True)

    async def _write(self, *, released: bool = False) -> None:
        assert self._expires_at is not None
        await self.store.write_lease(
            Lease(
                boot=self.store.boot,
                length=self.length,
                expires_at=self._expires_at,
                reconciled_at=self._reconciled_at,
                released=released,
            )
        )


def new_fence_link(settings: Settings, driver: Driver, metrics: Metrics | None) -> FenceLink:
    """The fence of this agent's host, as its settings and driver call for."""
    length = settings.self_fence_after
    if length <= 0:
        return FenceLink(MemoryLeaseStore(), None, length=0, metrics=metrics)
    if settings.compute.driver == "fake":
        store = MemoryLeaseStore()
        return FenceLink(store, TaskLauncher(driver, store), length=length, metrics=metrics)
    file_store = FileLeaseStore(settings.state_dir)
    return FenceLink(file_store, ProcessLauncher(settings), length=length, metrics=metrics)
