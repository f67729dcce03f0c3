"""The build deadline: no instance stays in BUILD for ever.

Whatever goes wrong with a build — its agent killed mid-build, its message dead-lettered
after the broker or the database stayed away too long — the instance must not hang in
BUILD holding a claim. Every conductor sweeps periodically: an instance still building
``KEEL_BUILD_TIMEOUT`` seconds after it was created goes to ERROR with a fault saying so,
and its claims are released, in one transaction. Several conductors sweep safely at the
same time: each instance is taken by one of them (the rows are locked and skipped by the
others), and the change is a compare-and-swap on the building state.

An agent that finishes such a build late asks the conductor first (``check_build``) and
removes the guest it made instead of reporting it.
"""

from __future__ import annotations

import logging

import asyncpg

from services.conductor.builds.task import CREATE_ACTION
from shared.db import allocations, instance_actions, instances

LOG = logging.getLogger(__name__)

#: Longest pause between two sweeps, in seconds.
MAX_INTERVAL = 60.0


class BuildDeadline:
    def __init__(self, pool: asyncpg.Pool, timeout: float) -> None:
        self.pool = pool
        self.timeout = timeout

    @property
    def enabled(self) -> bool:
        return self.timeout > 0

    @property
    def interval(self) -> float:
        """Sweep often enough that an instance overstays by at most a tenth of the timeout."""
        return min(MAX_INTERVAL, max(self.timeout / 10, 0.5))

    async def sweep(self) -> int:
        """Put every instance building for too long in ERROR; return how many."""
        expired_total = 0
        while True:
            async with self.pool.acquire() as conn, conn.transaction():
                expired = await instances.expire_builds(conn, self.timeout)
                released = 0
                for instance in expired:
                    released += len(await allocations.release_instance(conn, instance.uuid))
                    message = instance.fault.message if instance.fault else "build timed out"
                    await instance_actions.finish(conn, instance.uuid, CREATE_ACTION, message)
            for instance in expired:
                LOG.warning(
                    "instance %s was still building after %gs (host %s): put in ERROR and "
                    "its claims released",
                    instance.uuid,
                    self.timeout,
                    instance.host or "none yet",
                    extra={"instance_uuid": str(instance.uuid), "decision": "build_timed_out"},
                )
            expired_total += len(expired)
            if not expired:
                return expired_total
