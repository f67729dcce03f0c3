"""Fault injection, for tests and rehearsals only: die at a named point of a workflow.

``KEEL_FAULT_INJECT=<point>`` arms one point; a process that reaches it logs one line
and kills itself with SIGKILL, as a power cut or the OOM killer would, leaving whatever
it was doing half done. That is how the tests show that every workflow recovers from a
crash at its most awkward moment. Never set it in production.
"""

from __future__ import annotations

import logging
import os
import signal

LOG = logging.getLogger(__name__)

#: Every point a process can be armed to die at, and what has happened by then.
POINTS: dict[str, str] = {
    "conductor.build.after_claim": "the scheduler claimed a host; the placement is not "
    "recorded and the build not sent",
    "conductor.build.after_placement": "the placement is recorded; the build is not sent",
    "scheduler.select.after_claim": "the claim is committed; the conductor has no answer",
    "compute.build.before_spawn": "the agent took the build; no guest exists yet",
    "compute.build.after_spawn": "the guest exists; the conductor was not told",
    "conductor.move.after_destination": "a move's destination is claimed and recorded "
    "(pre-migrating); the rebuild is not sent",
    "compute.rebuild.after_spawn": "the moved guest exists on its destination; the "
    "conductor was not told",
    "compute.rebuild_guest.destroyed": "a rebuild removed the server's old guest; the new "
    "one is not made",
    "compute.snapshot.before_upload": "a snapshot's data is written on the agent; none of "
    "it is uploaded",
    "compute.shelve.powered_off": "a shelve powered the guest off; its disk is not written",
    "compute.shelve.before_upload": "a shelve's data is written on the agent; none of it "
    "is uploaded",
    "conductor.shelve.offload_begun": "a shelve is recorded and its offload begun (the "
    "server has no current copy); the agent was not asked to destroy the guest",
    "conductor.unshelve.after_placement": "an unshelve's host is claimed and recorded "
    "(spawning); the build is not sent",
    "conductor.confirm.after_remove": "the source's copy of a confirmed cold migration is "
    "removed; the record is still confirming and both claims are held",
}


class FaultPoints:
    """The armed point of this process, if any (from ``Settings.fault_inject``)."""

    def __init__(self, armed: str | None = None) -> None:
        if armed is not None and armed not in POINTS:
            raise ValueError(f"unknown fault-injection point {armed!r}")
        self.armed = armed

    def reached(self, point: str) -> None:
        """Die at once if ``point`` is the armed one."""
        assert point in POINTS, point
        if point != self.armed:
            return
        LOG.critical("fault injection: reached %s; killing this process (SIGKILL)", point)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
