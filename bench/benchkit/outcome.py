"""After a fault: did every server the API accepted end as it should, exactly once?

Read from the database and from the agents' guest directories (:meth:`Stage.guests`)
once the cloud settled, and counted:

* **lost** — a server the API accepted (202, or found by name after a create whose
  answer was lost) that is gone though nobody deleted it, or that never ended ACTIVE or
  ERROR;
* **duplicated** — a second copy of anything: a guest on two hosts, a guest whose
  server is not an ACTIVE server of this run, a live server nobody was told was
  created, more than one claim for one server;
* **stuck** — a live server still building or with a task in progress.

``usage_drift`` is the scheduler's invariant (each node's usage is the sum of its
claims): 0 means nothing leaked.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from uuid import UUID

from benchkit.ha import Stage
from shared.db import allocations
from shared.db.errors import is_unavailable

#: Seconds to wait, after the load, for every server to leave BUILD and every task to end.
SETTLE_TIMEOUT = 300.0


@dataclass(frozen=True)
class Outcome:
    accepted: int
    #: Final ``vm_state`` of the accepted servers still live (``active``, ``error``…).
    states: dict[str, int]
    lost: int
    duplicated: int
    stuck: int
    usage_drift: int
    #: Seconds the cloud took to settle after the load ended.
    settled_in: float
    #: The servers counted as lost or stuck, to look for in the logs.
    suspects: tuple[UUID, ...] = ()

    @property
    def whole(self) -> bool:
        return not (self.lost or self.duplicated or self.stuck or self.usage_drift)

    def figures(self) -> dict[str, object]:
        return {
            "accepted": self.accepted,
            **{f"left_{state}": count for state, count in sorted(self.states.items())},
            "lost": self.lost,
            "duplicated": self.duplicated,
            "stuck": self.stuck,
            "usage_drift": self.usage_drift,
            "settled_in_s": round(self.settled_in, 1),
            "suspects": ",".join(str(server) for server in self.suspects[:5]) or "none",
        }


async def _unsettled(stage: Stage) -> int:
    async with stage.cloud.pool.acquire() as conn:
        count: int = await conn.fetchval(
            """SELECT count(*) FROM instances
                WHERE deleted_at IS NULL AND (vm_state = 'building' OR task_state IS NOT NULL)"""
        )
    return count


async def settle(stage: Stage, timeout: float = SETTLE_TIMEOUT) -> float:
    """Seconds until no live server is building or busy (at most ``timeout``)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if await _unsettled(stage) == 0:
                break
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            # The database is failing over: ask again.
        await asyncio.sleep(0.5)
    return time.monotonic() - began


async def outcome(
    stage: Stage, accepted: set[UUID], *, deleted: frozenset[UUID] = frozenset()
) -> Outcome:
    """Settle, then count (see the module docstring). ``deleted``: servers the clients
    deleted on purpose (boot-and-delete); they should be gone, guests and all."""
    settled_in = await settle(stage)
    async with stage.cloud.pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT uuid, vm_state, task_state, deleted_at IS NOT NULL AS gone
                 FROM instances"""
        )
        claims = await conn.fetch(
            "SELECT instance_uuid, count(*) AS n FROM allocations GROUP BY instance_uuid"
        )
        drift = len(await allocations.usage_drift(conn))
    live = {row["uuid"]: row for row in rows if not row["gone"]}
    states: Counter[str] = Counter()
    suspects: list[UUID] = []
    for server in accepted - deleted:
        row = live.get(server)
        if row is not None:
            states[row["vm_state"]] += 1
        if row is None or row["vm_state"] not in ("active", "error"):
            suspects.append(server)
    busy = [s for s, row in live.items() if row["vm_state"] == "building" or row["task_state"]]
    active = {server for server, row in live.items() if row["vm_state"] == "active"}
    duplicated = sum(1 for server in live if server not in accepted)
    duplicated += sum(1 for row in claims if row["n"] > 1)
    for server, hosts in stage.guests().items():
        # One guest per ACTIVE server; any other is a copy left behind.
        duplicated += len(hosts) - 1 if server in active else len(hosts)
    return Outcome(
        accepted=len(accepted),
        states=dict(states),
        lost=len(suspects),
        duplicated=duplicated,
        stuck=len(busy),
        usage_drift=drift,
        settled_in=settled_in,
        suspects=tuple(dict.fromkeys([*suspects, *busy])),
    )
