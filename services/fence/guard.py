"""The host fence: no guest of this host runs past the lease the control plane renewed.

A guest lives in its hypervisor, not in keel-compute: an agent that is SIGKILLed,
OOM-killed, hung or cut off leaves its guests running while the control plane may
rebuild them elsewhere. So a second process per compute host, keel-fence, holds a
**lease** that only the agent's answered heartbeats renew (:mod:`services.fence.api`),
and acts on it by itself (:class:`HostFence`, one look per tick):

* **armed** — the lease runs: nothing to do;
* **fired** — the lease ran out (the agent dead, hung or cut off alike): it records the
  fencing durably in ``fenced.json`` first, then powers off every running guest of the
  node at once (as pulling the plug: never a disk destroyed), and keeps them off, tick
  after tick, until the agent has reconciled its guests with the control plane *after*
  the fencing and renewed the lease — then the fencing is lifted (``fenced.json``
  removed). The guests it powered off stay off until someone starts them;
* **unarmed** — no lease yet (an agent that has not heartbeated since it started): it
  guards nothing, and the control plane never counts this host as fenced by time.

keel-api and keel-conductor let a silent host's servers be evacuated without an
operator only if the host's last heartbeat said its fence was armed with a lease of L
seconds, and only once L plus a margin has passed since that heartbeat
(:mod:`shared.host_fencing`): by then this fence has fired, or was never there to fire,
which the heartbeat would have said.

A fence exits by itself once it has nothing left to guard: the agent released the lease
(it stopped cleanly with no guest running), or the lease ran out, the guests are off and
no agent holds the host. Every look is idempotent: firing a fired fence only powers off
whatever runs again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from services.compute.durable import fsync_dir, write_synced
from services.compute.virt.driver import Driver
from services.fence.api import FENCED_FILE, TICK, FenceState, FenceStatus, Lease, LeaseStore
from shared.exceptions import GuestNotFound
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)


class HostFence:
    """See the module's text. ``record_dir``: where ``fenced.json`` is kept (the agent's
    state directory); ``None``: nowhere (guests in memory)."""

    def __init__(
        self,
        driver: Driver,
        store: LeaseStore,
        *,
        record_dir: Path | None,
        watchdog: Callable[[], None] | None = None,
    ) -> None:
        self._driver = driver
        self._store = store
        self._record = None if record_dir is None else record_dir / FENCED_FILE
        self._watchdog = watchdog
        self.state: FenceState = "unarmed"
        self.fired_at: float | None = None
        self.fires = 0
        self._lease: Lease | None = None
        if self._record is not None and self._record.exists():
            self.state, self.fired_at = "fired", self._recorded_at(self._record)
            LOG.warning(
                "this host was fenced before this fence started (%s): its guests are kept "
                "off until the agent has reconciled them",
                self._record,
                extra={"decision": "still_fenced"},
            )

    def _recorded_at(self, record: Path) -> float | None:
        """When a fencing recorded by this boot fired (``None``: another boot's, or no
        time: any reconcile lifts it)."""
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            return None
        if data.get("boot") != self._store.boot:
            return None
        at = data.get("fired_at_monotonic")
        return float(at) if isinstance(at, int | float) else None

    # --- one look -------------------------------------------------------------------------

    async def tick(self) -> bool:
        """Look at the lease and act; False once nothing is left to guard (exit)."""
        if self._watchdog is not None:
            self._watchdog()
        if self._store.gone():
            LOG.warning("the host's state directory is gone: nothing left to guard; exiting")
            return False
        lease = await self._store.read_lease()
        if lease is not None and lease.boot != self._store.boot:
            lease = None  # an earlier boot's: the guests it guarded did not survive it
        self._lease = lease
        now = self._store.now()
        if self.state == "fired":
            if self._lifted_by(lease, now):
                await asyncio.to_thread(self._lift)
            else:
                await self._power_off_all()
        elif lease is None:
            self.state = "unarmed"
        elif lease.released:
            self.state = "released"
        elif now >= lease.expires_at:
            await self.fire(now - (lease.expires_at - lease.length))
        else:
            self.state = "armed"
        await self._store.write_status(self.status(now))
        return not await self._done()

    def _lifted_by(self, lease: Lease | None, now: float) -> bool:
        """A reconcile begun after the fencing, and a lease renewed since."""
        if lease is None or lease.reconciled_at is None or now >= lease.expires_at:
            return False
        return self.fired_at is None or lease.reconciled_at >= self.fired_at

    async def _done(self) -> bool:
        if self.state == "released":
            LOG.info(
                "the agent stopped with no guest running: nothing left to guard; exiting",
                extra={"decision": "fence_released"},
            )
            return True
        if self._store.agent_alive() or self.state == "armed":
            return False
        if self.state == "fired" and await self._running():
            return False
        LOG.info(
            "no agent holds this host and no guest runs (%s): nothing left to guard; exiting",
            self.state,
            extra={"decision": "fence_idle"},
        )
        return True

    def status(self, now: float) -> FenceStatus:
        lease = self._lease
        return FenceStatus(
            boot=self._store.boot,
            pid=os.getpid(),
            beat_at=now,
            state=self.state,
            length=None if lease is None else lease.length,
            expires_at=None if lease is None else lease.expires_at,
            fired_at=self.fired_at,
            fires=self.fires,
            watchdog=self._watchdog is not None,
        )

    # --- firing ---------------------------------------------------------------------------

    async def fire(self, silent_for: float) -> None:
        """Record the fencing durably, then power every running guest off."""
        now = self._store.now()
        self.state, self.fired_at = "fired", now
        self.fires += 1
        if self._record is not None:
            await asyncio.to_thread(self._write_record, now, silent_for, [])
        stopped = await self._power_off_all()
        if self._record is not None:
            await asyncio.to_thread(self._write_record, now, silent_for, stopped)
        LOG.error(
            "fenced: the lease ran out (no heartbeat answered for %.0fs): powered off %d "
            "guest(s)%s; they are kept, never destroyed, and stay off until the agent has "
            "reconciled them with the control plane",
            silent_for,
            len(stopped),
            f" ({', '.join(str(g) for g in stopped)})" if stopped else "",
            extra={"decision": "fence_fired"},
        )

    async def _running(self) -> list[UUID]:
        found = []
        for guest in await self._driver.list_instances():
            try:
                if await self._driver.guest_power(guest) is PowerState.RUNNING:
                    found.append(guest)
            except GuestNotFound:
                continue
        return found

    async def _power_off_all(self) -> list[UUID]:
        """Power off, at once, every guest that runs; the ones it stopped.

        Only a running guest: a paused one executes nothing, and powering off a
        suspended one would lose the memory it saved.
        """
        stopped = []
        for guest in await self._running():
            try:
                await self._driver.halt(guest)
            except GuestNotFound:
                continue
            except Exception:
                LOG.exception("could not power off guest %s while fenced", guest)
                continue
            stopped.append(guest)
            LOG.warning(
                "guest %s powered off: this host is fenced",
                guest,
                extra={"instance_uuid": str(guest), "decision": "guest_fenced"},
            )
        return stopped

    def _write_record(self, at: float, silent: float, guests: list[UUID]) -> None:
        assert self._record is not None
        record = {
            "fenced_at": datetime.now(UTC).isoformat(),
            "boot": self._store.boot,
            "fired_at_monotonic": at,
            "silent_for": round(silent, 3),
            "powered_off": [str(g) for g in guests],
        }
        scratch = self._record.with_name(f".{FENCED_FILE}.{secrets.token_hex(4)}")
        write_synced(scratch, json.dumps(record, indent=2).encode())
        os.replace(scratch, self._record)
        fsync_dir(self._record.parent)

    def _lift(self) -> None:
        if self._record is not None:
            try:
                self._record.unlink()
            except FileNotFoundError:
                pass
            else:
                fsync_dir(self._record.parent)
        self.state, self.fired_at = "armed", None
        LOG.warning(
            "fencing lifted: the agent reconciled its guests with the control plane and its "
            "lease runs again; the guests powered off stay off until someone starts them",
            extra={"decision": "fence_lifted"},
        )

    # --- the loop -------------------------------------------------------------------------

    async def run(
        self, stopping: asyncio.Event | None = None, *, interval: float | None = TICK
    ) -> None:
        """Look every ``interval`` seconds, and at once when the lease is written, until
        nothing is left to guard or ``stopping`` is set (``interval`` None: only when the
        lease is written — a clock of its own wakes it otherwise)."""
        changed = self._store.changed()
        while stopping is None or not stopping.is_set():
            changed.clear()  # before the look: a lease written during it wakes the next
            try:
                if not await self.tick():
                    return
            except Exception:
                LOG.exception("the fence's look failed; it looks again shortly")
            try:
                async with asyncio.timeout(interval):
                    await changed.wait()
            except TimeoutError:
                pass
