"""Gauges of the whole fleet, read from the database by keel-api for Prometheus.

With ``KEEL_METRICS_BIND`` set, keel-api counts, every ``KEEL_REPORT_INTERVAL`` seconds,
what the operator's page shows: compute hosts by state (by the same rule as the page and
``evacuate``: :mod:`shared.host_fencing`) and disabled, live servers by status, moves not yet
ended, and moves that ended in the last hour. Every keel-api of a deployment reports the
same figures: aggregate them with ``max``, not ``sum``. Label sets that no longer apply
are dropped at each refresh, so a state nothing is in reads as absent, not stale.
"""

from __future__ import annotations

import asyncpg

from services.api.ops.views import host_view
from services.api.servers.views import server_status
from shared.config import Settings
from shared.db import fleet, recoveries
from shared.metrics import Metrics

#: Seconds back that ended moves are counted.
ENDED_WINDOW = 3600.0
#: The ``state`` label of each host state the page shows.
_STATE_LABELS = {"up": "up", "down": "down", "fenced": "fenced", "forced down": "forced_down"}


class FleetGauges:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, metrics: Metrics) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics

    async def refresh(self) -> None:
        """Read the figures and set the gauges (all or none of them)."""
        async with self.pool.acquire() as conn:
            hosts = await recoveries.compute_hosts(conn, self.settings.service_down_time)
            states = await fleet.server_states(conn)
            moves = await fleet.move_counts(conn, ended_within=ENDED_WINDOW)
        host_states = dict.fromkeys(_STATE_LABELS.values(), 0)
        disabled = 0
        for host in hosts:
            view = host_view(host, {}, self.settings)
            host_states[_STATE_LABELS[view.state]] += 1
            disabled += view.disabled
        statuses: dict[str, int] = {}
        for vm_state, task_state, n in states:
            status = server_status(vm_state, task_state)
            statuses[status] = statuses.get(status, 0) + n
        self._set_hosts(host_states, disabled)
        self._set_servers(statuses)
        self._set_moves(moves)

    def _set_hosts(self, states: dict[str, int], disabled: int) -> None:
        gauge = self.metrics.compute_hosts
        for state, n in states.items():
            gauge.labels(state=state).set(n)
        self.metrics.compute_hosts_disabled.set(disabled)

    def _set_servers(self, statuses: dict[str, int]) -> None:
        gauge = self.metrics.servers
        gauge.clear()
        for status, n in statuses.items():
            gauge.labels(status=status).set(n)

    def _set_moves(self, counts: list[tuple[str, str, int]]) -> None:
        still, ended = self.metrics.moves_open, self.metrics.moves_ended_last_hour
        still.clear()
        ended.clear()
        for kind, status, n in counts:
            gauge = still if status in fleet.OPEN_STATUSES else ended
            gauge.labels(type=kind, status=status).set(n)
