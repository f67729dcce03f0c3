"""Automatic evacuation of fenced hosts (instance HA built in), opt-in.

With ``KEEL_RECOVERY__AUTO_EVACUATE`` at ``tagged`` (servers whose metadata has
``HA_Enabled=True``, Masakari's convention) or ``all``, every conductor runs this sweep
periodically. A pass:

1. lists the compute hosts and decides which are **fenced** — forced down, or silent
   past their fence's lease and the margin (:mod:`shared.host_fencing`, the rule ``evacuate``
   follows too) — and sets the ``keel_hosts_fenced`` gauge;
2. refuses every host of an availability zone in which more than
   ``KEEL_RECOVERY__MAX_DOWN_FRACTION`` of the compute hosts are down: that many hosts
   failing at once is a network or control-plane failure, which evacuating would only
   make worse. It says so in a WARNING (when it starts and when it ends) and counts it
   (``keel_auto_evacuations_refused_total{reason="zone_down_fraction"}``); a host
   whose agent does not fence itself is never taken, and said so once
   (``reason="not_self_fencing"``);
3. takes a session advisory lock, so one conductor at a time starts evacuations, and
   unless a host was taken less than ``60 / KEEL_RECOVERY__HOSTS_PER_MINUTE`` seconds
   ago (``host_recoveries``), takes **one** host — the one silent longest with servers
   to evacuate — and records it;
4. evacuates each of its servers that is ACTIVE or SHUTOFF with no task (and tagged,
   for ``tagged``) exactly as keel-api does (:mod:`shared.db.move_requests`): the task,
   an ``evacuate`` instance action by user ``keel-recovery`` and the migration record in
   one compare-and-swap transaction, then the cast to the conductors, withdrawn if it
   cannot be sent. Two sweeps at once start one evacuation per server: the second finds
   the task set. Each started one counts in ``keel_auto_evacuations_started_total``.

The scheduler picks each destination, as for ``openstack server evacuate`` without a
host; the move workflow (:mod:`services.conductor.moves`) carries it out.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from uuid import UUID

import asyncpg

from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import move_requests, recoveries
from shared.db.pool import Connection
from shared.db.recoveries import ComputeHost
from shared.host_fencing import FenceState, fence_state
from shared.metrics import Metrics
from shared.objects.migration import EVACUATION

LOG = logging.getLogger(__name__)

#: Who the instance actions and migration records of automatic evacuations name.
RECOVERY_USER = "keel-recovery"
#: The longest pause between two sweeps.
MAX_INTERVAL = 10.0
#: The zone of a host without a node.
NO_ZONE = "(none)"


def system_context() -> RequestContext:
    return RequestContext(user_id=RECOVERY_USER, roles=("admin",))


def crowded_zones(hosts: list[ComputeHost], max_fraction: float) -> dict[str, tuple[int, int]]:
    """Zones with more than ``max_fraction`` of their hosts down: zone → (down, total)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for host in hosts:
        count = counts[host.zone or NO_ZONE]
        count[1] += 1
        if not host.service.is_up:
            count[0] += 1
    return {
        zone: (down, total) for zone, (down, total) in counts.items() if down / total > max_fraction
    }


class Recovery:
    """The automatic evacuation sweep of one conductor; see the module's text."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        conductor: ConductorAPI,
        settings: Settings,
        metrics: Metrics | None = None,
    ) -> None:
        self.pool = pool
        self.conductor = conductor
        self.mode = settings.recovery.auto_evacuate
        self.spacing = 60.0 / settings.recovery.hosts_per_minute
        self.max_fraction = settings.recovery.max_down_fraction
        self.down_time = settings.service_down_time
        self.margin = settings.fencing.margin
        self.metrics = metrics or Metrics()
        #: Zones refused at the last sweep, and hosts said never to fence themselves.
        self._crowded: dict[str, tuple[int, int]] = {}
        self._told_unfenced: set[int] = set()

    @property
    def interval(self) -> float:
        return max(0.5, min(MAX_INTERVAL, self.down_time / 4))

    async def sweep(self) -> int:
        """One pass; how many evacuations it started."""
        async with self.pool.acquire() as conn:
            hosts = await recoveries.compute_hosts(conn, self.down_time)
        states = {
            host.service.id: fence_state(
                host.service, host.silent_for, down_time=self.down_time, margin=self.margin
            )
            for host in hosts
        }
        self.metrics.hosts_fenced.set(sum(state.fenced for state in states.values()))
        if self.mode == "off":
            return 0
        crowded = self._note_crowded(crowded_zones(hosts, self.max_fraction))
        waiting = []
        for host in hosts:
            state = states[host.service.id]
            if state.up:
                self._told_unfenced.discard(host.service.id)
            elif (host.zone or NO_ZONE) in crowded:
                self.metrics.auto_evacuations_refused.labels(reason="zone_down_fraction").inc()
            elif state.fenced:
                waiting.append(host)
            elif state.seconds_left is None:
                self._note_unfenced(host, state)
        if not waiting:
            return 0
        waiting.sort(key=lambda h: -(h.silent_for or 0.0))
        return await self._recover_one(waiting, states)

    def _note_crowded(self, now: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        for zone, (down, total) in now.items():
            if zone not in self._crowded:
                LOG.warning(
                    "not evacuating any server automatically in availability zone %s: %d of "
                    "its %d compute hosts are down, more than KEEL_RECOVERY__MAX_DOWN_FRACTION "
                    "(%g). That is a network or control-plane failure, not host failures; "
                    "evacuate by hand once the hosts are known to be off",
                    zone,
                    down,
                    total,
                    self.max_fraction,
                    extra={"decision": "auto_evacuation_refused"},
                )
        for zone in set(self._crowded) - set(now):
            LOG.info(
                "availability zone %s has few enough hosts down again: fenced hosts in it are "
                "evacuated automatically",
                zone,
            )
        self._crowded = now
        return now

    def _note_unfenced(self, host: ComputeHost, state: FenceState) -> None:
        if host.service.id in self._told_unfenced:
            return
        self._told_unfenced.add(host.service.id)
        self.metrics.auto_evacuations_refused.labels(reason="not_self_fencing").inc()
        LOG.warning(
            "not evacuating host %s automatically: %s",
            host.service.host,
            state.why,
            extra={"decision": "auto_evacuation_refused"},
        )

    async def _recover_one(self, waiting: list[ComputeHost], states: dict[int, FenceState]) -> int:
        """Under the lock and the pace, evacuate the servers of the first host with some."""
        async with self.pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", recoveries.LOCK_KEY):
                return 0  # another conductor is starting evacuations right now
            try:
                since = await recoveries.seconds_since_last_start(conn)
                if since is not None and since < self.spacing:
                    return 0
                tagged = self.mode == "tagged"
                for host in waiting:
                    node_ids = [node.id for node in host.nodes]
                    servers = await recoveries.evacuable(conn, node_ids, tagged=tagged)
                    if servers:
                        recovery_id = await recoveries.start(conn, host.service)
                        return await self._evacuate(
                            conn, recovery_id, host, servers, states[host.service.id]
                        )
                return 0
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", recoveries.LOCK_KEY)

    async def _evacuate(
        self,
        conn: Connection,
        recovery_id: int,
        host: ComputeHost,
        servers: list[tuple[UUID, int]],
        state: FenceState,
    ) -> int:
        LOG.warning(
            "evacuating %d server(s) of host %s automatically (KEEL_RECOVERY__AUTO_EVACUATE="
            "%s): %s",
            len(servers),
            host.service.host,
            self.mode,
            state.why,
            extra={"decision": "auto_evacuation_started"},
        )
        ctx = system_context()
        by_id = {node.id: node for node in host.nodes}
        started = skipped = 0
        for server, node_id in servers:
            migration = await move_requests.record(
                self.pool, ctx, EVACUATION, instance_uuid=server, source=by_id[node_id]
            )
            if migration is None:
                skipped += 1
                continue
            outcome, error = await move_requests.cast_or_withdraw(
                self.pool, ctx, EVACUATION, migration, self.conductor.evacuate_instance
            )
            extra = {"instance_uuid": str(server), "migration_uuid": str(migration.uuid)}
            if outcome is move_requests.Outcome.WITHDRAWN:
                skipped += 1
                self.metrics.auto_evacuations_refused.labels(reason="cast_failed").inc()
                LOG.warning(
                    "automatic evacuation of server %s withdrawn: %s", server, error, extra=extra
                )
                continue
            started += 1
            self.metrics.auto_evacuations_started.inc()
            LOG.info(
                "automatic evacuation %s of server %s from %s started",
                migration.uuid,
                server,
                host.service.host,
                extra={**extra, "decision": "auto_evacuation_started"},
            )
        await recoveries.finish(conn, recovery_id, evacuations=started, skipped=skipped)
        return started
