"""An agent's contact with the control plane, and its host's fence kept in step with it.

A host whose heartbeats stop may be cut off, not dead: its guests go on running while
keel may rebuild them elsewhere. So the agent watches its own contact with the control
plane — the heartbeats the conductor answered — and acts on what it sees
(:class:`ContactWatch`, one per agent, running from the start of start-up to the end):

* **The fence's lease.** Every answered heartbeat renews the lease of the host's fence
  (:mod:`services.compute.fence_link`), a separate keel-fence process that powers every
  guest off once the lease runs out — whether this agent is cut off, hung or dead — and
  keeps them off until the agent has reconciled. The watch keeps that fence running
  (it starts one again if it died) and notices when it fired.
* **Reconcile on reconnect.** Once its broker connection is lost, or no heartbeat has
  succeeded for twice ``KEEL_REPORT_INTERVAL`` (every conductor gone, or a cut the
  connection has not noticed yet), or its fence fired, the agent stops serving anything
  that could start a guest — builds, rebuilds, start, reboot, unpause, resume, the end
  of a revert wait (:meth:`ContactWatch.wait_serving`) — until a guest report it sent
  *after* contact came back has been answered and acted on: the same reconcile as at
  start-up, which removes the copies evacuated meanwhile and keeps shut down those being
  evacuated. Only then does it serve again, and the fence is told (which lifts a
  fencing). The guests the fence powered off stay off: their servers show ``SHUTOFF``
  (their power state follows the host's report) until someone starts them.
* **No guest starts without an armed fence** (unless fencing is switched off,
  ``KEEL_FENCING__SELF_FENCE_AFTER=0``): while the fence is not running, or not yet
  enforcing this agent's lease, builds and starts wait.

At start-up the agent serves nothing before its first reconcile anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from uuid import UUID

from services.compute.fence_link import FenceLink

LOG = logging.getLogger(__name__)

#: Longest pause between two looks at the agent's contact.
MAX_TICK = 1.0
#: Longest pause between two attempts of the reconcile after a reconnection.
MAX_RETRY = 10.0

Clock = Callable[[], float]


class ContactWatch:
    """See the module's text. ``reconcile`` is the agent's guest report (start-up's)."""

    def __init__(
        self,
        fence: FenceLink,
        *,
        lost_after: float,
        clock: Clock = time.monotonic,
        self_ticking: bool = True,
    ) -> None:
        self.fence = fence
        self.lost_after = lost_after
        self._clock = clock
        #: Whether :meth:`run` looks every tick by itself (else only once, at its start:
        #: a test that keeps time itself calls :meth:`tick`).
        self.self_ticking = self_ticking
        #: When the last heartbeat that succeeded was sent, or heartbeats began: what
        #: "contact lost" counts from. Before heartbeats begin (start-up) contact is never
        #: lost: the first guest report decides.
        self._contact = clock()
        self._beating = False
        #: Whether a reconcile must run before the agent serves (until the first one).
        self._must_reconcile = True
        #: When contact was last found lost: a reconcile counts only if it began after.
        self._lost_at = self._contact
        self._changed = asyncio.Event()
        self._answered = asyncio.Event()
        self._reconcile: Callable[[], Awaitable[None]] | None = None
        self._retry_at = 0.0
        self._failures = 0

    # --- what the agent tells it -------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def heartbeats_begin(self) -> None:
        """The agent starts heartbeating (after start-up's first guest report)."""
        self._contact = max(self._contact, self._clock())
        self._beating = True

    async def heartbeat_succeeded(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (:meth:`now`) was answered: the lease runs on."""
        if sent_at - self._contact > self.lost_after:
            # Silent longer than allowed although nobody looked (a busy event loop).
            self._lose(sent_at)
        self._contact = max(self._contact, sent_at)
        await self.fence.renew(sent_at)
        self._changed.set()
        self._answered.set()

    async def reconciled(self, started_at: float) -> None:
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
        await self.fence.reconciled(started_at)
        self._changed.set()

    def contact_lost(self, why: str = "its broker connection was lost") -> None:
        """Contact is lost now (the broker connection dropped, say): a reconcile is due."""
        self._lose(self._clock(), why)

    def attach(self, reconcile: Callable[[], Awaitable[None]]) -> None:
        """Run ``reconcile`` by itself once contact is back (after start-up's first one)."""
        self._reconcile = reconcile

    # --- what it answers -----------------------------------------------------------------

    def lost(self) -> bool:
        """Whether heartbeats go unanswered for longer than ``lost_after``."""
        return self._beating and self._clock() - self._contact > self.lost_after

    def serving(self) -> bool:
        """Whether the agent may start guests now: contact, reconciled since, and an
        armed fence (when fencing is on)."""
        self._check()
        if self._must_reconcile:
            return False
        return not self.fence.enabled or self.fence.armed()

    async def wait_serving(self, what: str, instance_uuid: UUID) -> None:
        """Until :meth:`serving`; logs once what waits."""
        if self.serving():
            return
        LOG.info(
            "%s of guest %s waits: %s",
            what,
            instance_uuid,
            "this agent lost contact with the control plane and starts nothing before its "
            "guests are reconciled"
            if self._must_reconcile
            else "this host's fence is not armed yet, and no guest starts without it",
            extra={"instance_uuid": str(instance_uuid), "decision": "waiting_for_reconcile"},
        )
        while not self.serving():
            self._changed.clear()
            try:
                async with asyncio.timeout(self._tick()):
                    await self._changed.wait()
            except TimeoutError:
                pass

    async def wait_answered(self) -> None:
        """Until a heartbeat is answered after now, or :data:`MAX_RETRY` seconds."""
        self._answered.clear()
        try:
            async with asyncio.timeout(MAX_RETRY):
                await self._answered.wait()
        except TimeoutError:
            pass

    def wake(self) -> None:
        """Something a waiter waits for may have changed (the fence's status)."""
        self._changed.set()

    # --- the watch -------------------------------------------------------------------------

    def _tick(self) -> float:
        return max(0.05, min(MAX_TICK, self.lost_after / 4))

    def _check(self) -> None:
        if self.lost() and not self._must_reconcile:
            self._lose(self._clock())
        elif self.fence.fired() and not self._must_reconcile:
            self._lose(self._clock(), "this host's fence fired (its lease ran out)")

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
        """Watch until ``stopping``: keep the fence running, reconcile when contact is back."""
        while not stopping.is_set():
            try:
                await self.tick()
            except Exception:
                LOG.exception("the contact watch failed; it looks again shortly")
            try:
                async with asyncio.timeout(self._tick() if self.self_ticking else None):
                    await stopping.wait()
            except TimeoutError:
                pass

    async def tick(self) -> None:
        """One look: the fence runs, and a reconcile after a reconnection."""
        if self.fence.ensure():
            self._changed.set()
        self.fence.observe()
        self._check()
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
        await self.reconciled(started)
