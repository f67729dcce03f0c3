"""An agent cut off from the control plane: it fences itself, and reconciles on its return.

A host whose heartbeats stop may be cut off, not dead: its guests go on running while
keel may rebuild them elsewhere. So the agent watches its own contact with the control
plane — the heartbeats the conductor answered — and acts on what it sees
(:class:`Fencing`, one per agent, running from the start of start-up to the end):

* **Self-fencing.** Once no heartbeat has succeeded for ``KEEL_FENCING__SELF_FENCE_AFTER``
  seconds (twice ``KEEL_SERVICE_DOWN_TIME`` unless set; 0 never), counted from when the
  last successful one was *sent* (so from no later than the heartbeat the database
  recorded), it powers off every running guest on the host — never destroys one — and
  keeps them off while it stays fenced. Before the first power-off it writes the fencing to
  ``fenced.json`` in its state directory (durably: a crash does not forget it), logs it
  and counts it (``keel_self_fences_total``). keel lets the host's servers be evacuated
  only a down time and a margin later (:mod:`shared.fencing`).
* **Reconcile on reconnect.** Once its broker connection is lost, or no heartbeat has
  succeeded for twice ``KEEL_REPORT_INTERVAL`` (every conductor gone, or a cut the
  connection has not noticed yet), the agent stops serving anything that could start
  a guest — builds, rebuilds, start, reboot, unpause, resume, the end of a revert wait
  (:meth:`Fencing.wait_serving`) — until a guest report it sent *after* contact came
  back has been answered and acted on: the same reconcile as at start-up, which removes
  the copies evacuated meanwhile and keeps shut down those being evacuated. Only then
  does it serve again, and a fencing is lifted (``fenced.json`` removed, logged). The
  guests it powered off stay off: their servers show ``SHUTOFF`` (their power state
  follows the host's report) until someone starts them.

At start-up the agent serves nothing before its first reconcile anyway; a ``fenced.json``
left by an earlier run is kept until that reconcile, and said in the log.

Every change is idempotent: fencing a fenced host powers off whatever runs again (a
guest a build finished meanwhile), lifting a lifted fencing does nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from services.compute.durable import fsync_dir, write_synced
from services.compute.virt.driver import Driver
from shared.exceptions import GuestNotFound
from shared.metrics import Metrics
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)

#: The durable record of a fencing in the agent's state directory.
FENCED_FILE = "fenced.json"
#: Longest pause between two looks at the agent's contact.
MAX_TICK = 1.0
#: Longest pause between two attempts of the reconcile after a reconnection.
MAX_RETRY = 10.0

Clock = Callable[[], float]


class Fencing:
    """See the module's text. ``reconcile`` is the agent's guest report (start-up's)."""

    def __init__(
        self,
        driver: Driver,
        state_dir: Path,
        *,
        fence_after: float,
        lost_after: float,
        metrics: Metrics | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._driver = driver
        self.path = state_dir / FENCED_FILE
        self.fence_after = fence_after
        self.lost_after = lost_after
        self._metrics = metrics
        self._clock = clock
        #: When the last heartbeat that succeeded was sent (the agent's start before one):
        #: what the fencing counts from.
        self._last_ok = clock()
        #: When the last heartbeat that succeeded was sent, or heartbeats began: what
        #: "contact lost" counts from. Before heartbeats begin (start-up) contact is never
        #: lost: the first guest report decides.
        self._contact = self._last_ok
        self._beating = False
        #: Whether a reconcile must run before the agent serves (until the first one).
        self._must_reconcile = True
        #: When contact was last found lost: a reconcile counts only if it began after.
        self._lost_at = self._last_ok
        self.fenced = self.path.exists()
        self._changed = asyncio.Event()
        self._reconcile: Callable[[], Awaitable[None]] | None = None
        self._retry_at = 0.0
        self._failures = 0
        if self.fenced:
            LOG.warning(
                "this host fenced itself before this agent started (%s): its guests stay "
                "off, and nothing is started before the conductor has answered its guest "
                "report",
                self.path,
                extra={"decision": "still_fenced"},
            )

    # --- what the agent tells it -------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def heartbeats_begin(self) -> None:
        """The agent starts heartbeating (after start-up's first guest report)."""
        self._contact = max(self._contact, self._clock())
        self._beating = True

    def heartbeat_succeeded(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (:meth:`now`) was answered."""
        if sent_at - self._contact > self.lost_after:
            # Silent longer than allowed although nobody looked (a busy event loop).
            self._lose(sent_at)
        self._last_ok = max(self._last_ok, sent_at)
        self._contact = max(self._contact, sent_at)
        self._changed.set()

    def reconciled(self, started_at: float) -> None:
        """A guest report begun at ``started_at`` was answered and acted on.

        It counts if it began after contact was lost and heartbeats are answered again: a
        report answered while heartbeats are not (their outcome is what the database and
        so the evacuation rule see) lifts nothing.
        """
        if not self._must_reconcile or started_at < self._lost_at or self.lost():
            return
        self._must_reconcile = False
        self._failures = 0
        if self._reconcile is not None:  # not start-up's first report
            LOG.info(
                "guests reconciled after contact with the control plane came back: serving again",
                extra={"decision": "serving_after_reconcile"},
            )
        if self.fenced:
            self._lift()
        self._changed.set()

    def contact_lost(self, why: str = "its broker connection was lost") -> None:
        """Contact is lost now (the broker connection dropped, say): a reconcile is due."""
        self._lose(self._clock(), why)

    def attach(self, reconcile: Callable[[], Awaitable[None]]) -> None:
        """Run ``reconcile`` by itself once contact is back (after start-up's first one)."""
        self._reconcile = reconcile

    # --- what it answers -----------------------------------------------------------------

    def silent_for(self) -> float:
        """Seconds since the last successful heartbeat was sent."""
        return self._clock() - self._last_ok

    def lost(self) -> bool:
        """Whether heartbeats go unanswered for longer than ``lost_after``."""
        return self._beating and self._clock() - self._contact > self.lost_after

    def serving(self) -> bool:
        """Whether the agent may start guests now (contact, and reconciled since)."""
        self._check()
        return not self._must_reconcile

    async def wait_serving(self, what: str, instance_uuid: UUID) -> None:
        """Until :meth:`serving`; logs once what waits."""
        if self.serving():
            return
        LOG.info(
            "%s of guest %s waits: this agent lost contact with the control plane and "
            "starts nothing before its guests are reconciled",
            what,
            instance_uuid,
            extra={"instance_uuid": str(instance_uuid), "decision": "waiting_for_reconcile"},
        )
        while not self.serving():
            self._changed.clear()
            try:
                async with asyncio.timeout(self._tick()):
                    await self._changed.wait()
            except TimeoutError:
                pass

    # --- the watchdog ----------------------------------------------------------------------

    def _tick(self) -> float:
        return max(0.05, min(MAX_TICK, self.lost_after / 4))

    def _check(self) -> None:
        if self.lost() and not self._must_reconcile:
            self._lose(self._clock())

    def _lose(self, at: float, why: str | None = None) -> None:
        if self._must_reconcile:
            return
        LOG.warning(
            "%s: contact with the control plane is lost; starting no guest before the "
            "conductor has answered a guest report again",
            why or f"no heartbeat answered for {at - self._contact:.1f}s",
            extra={"decision": "contact_lost"},
        )
        self._must_reconcile = True
        self._lost_at = at

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch until ``stopping``: fence when due, reconcile when contact is back."""
        while not stopping.is_set():
            try:
                await self.tick()
            except Exception:
                LOG.exception("the self-fencing watchdog failed; it looks again shortly")
            try:
                async with asyncio.timeout(self._tick()):
                    await stopping.wait()
            except TimeoutError:
                pass

    async def tick(self) -> None:
        """One look: fence (or keep fenced), or reconcile after a reconnection."""
        self._check()
        if self.fence_after > 0 and self.silent_for() >= self.fence_after:
            await self.fence()
        elif self.fenced and self._must_reconcile:
            await self._power_off_all()
        if self._must_reconcile and not self.lost() and self._reconcile is not None:
            await self._reconcile_now()

    async def _reconcile_now(self) -> None:
        if self._clock() < self._retry_at:
            return
        assert self._reconcile is not None
        started = self._clock()
        try:
            await self._reconcile()
        except Exception as exc:
            self._failures += 1
            pause = min(MAX_RETRY, self._tick() * 2**self._failures)
            self._retry_at = self._clock() + pause
            LOG.warning(
                "the guest report after contact came back failed (%s); trying again in %.1fs",
                exc,
                pause,
            )
            return
        self.reconciled(started)

    async def fence(self) -> None:
        """Power every guest off and keep it so; the first time, record it durably first."""
        if not self.fenced:
            # Claimed before the first await: a twin finds it fenced and only keeps
            # guests off.
            self.fenced = True
            silent = self.silent_for()
            self._lose(self._clock())
            await asyncio.to_thread(self._record, silent, [])
            if self._metrics is not None:
                self._metrics.self_fences.inc()
            stopped = await self._power_off_all()
            await asyncio.to_thread(self._record, silent, stopped)
            LOG.error(
                "self-fenced: no heartbeat answered for %.0fs (KEEL_FENCING__SELF_FENCE_AFTER="
                "%g): powered off %d guest(s)%s; they are kept, never destroyed, and stay off. "
                "Once the conductor answers again this agent reconciles its guests before it "
                "starts anything (recorded in %s)",
                silent,
                self.fence_after,
                len(stopped),
                f" ({', '.join(str(g) for g in stopped)})" if stopped else "",
                self.path,
                extra={"decision": "self_fenced"},
            )
            return
        await self._power_off_all()

    async def _power_off_all(self) -> list[UUID]:
        """Power off every running guest; the ones it stopped."""
        stopped = []
        for guest in await self._driver.list_instances():
            try:
                # Only a running guest: a paused one does not run, and powering off a
                # suspended one would lose the memory it saved.
                if await self._driver.guest_power(guest) is not PowerState.RUNNING:
                    continue
                await self._driver.power_off(guest)
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

    def _record(self, silent: float, guests: list[UUID]) -> None:
        record = {
            "fenced_at": datetime.now(UTC).isoformat(),
            "silent_for": round(silent, 3),
            "self_fence_after": self.fence_after,
            "powered_off": [str(g) for g in guests],
        }
        scratch = self.path.with_name(f".{FENCED_FILE}.{secrets.token_hex(4)}")
        write_synced(scratch, json.dumps(record, indent=2).encode())
        os.replace(scratch, self.path)
        fsync_dir(self.path.parent)

    def _lift(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        else:
            fsync_dir(self.path.parent)
        self.fenced = False
        LOG.warning(
            "fencing lifted: the conductor answered this host's guest report; the guests "
            "powered off stay off until someone starts them",
            extra={"decision": "fence_lifted"},
        )
