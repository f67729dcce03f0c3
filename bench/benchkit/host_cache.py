"""The scheduler design keel did not keep, kept here so that the comparison can be rerun.

:class:`CachedHostManager` holds every host in memory and, per request, reads only the
rows changed since its last refresh (rows whose ``xmin`` is at or past the oldest
transaction running at that refresh), then filters and weighs *every* cached host in
Python. Database work per request stays small, but the Python work grows with the
cloud, and it blocks the event loop while it runs. ``bench/schedule.py --strategy
cache`` measures it beside the SQL candidate query keel uses (``--strategy sql``).

A prototype: it works out up/down from ``last_seen_up`` on this machine's clock and
never forgets a deleted host, which is good enough for the benchmark's cloud only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from services.scheduler.host_manager import HostManager, WeighedHost
from shared.db.pool import Connection
from shared.objects.compute_node import ComputeNode, HostState
from shared.objects.instance import RequestSpec
from shared.objects.service import Service

_CHANGED = """
    SELECT to_jsonb(n.*) AS node, to_jsonb(s.*) AS service
      FROM compute_nodes n JOIN services s ON s.id = n.service_id
     WHERE n.deleted_at IS NULL AND s.deleted_at IS NULL
       AND ($1::bigint IS NULL OR n.xmin::text::bigint >= $1 OR s.xmin::text::bigint >= $1)
"""


class CachedHostManager(HostManager):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hosts: dict[int, HostState] = {}
        self._marker: int | None = None
        self.rows_read = 0

    async def refresh(self, conn: Connection) -> None:
        """Read the rows changed since the last refresh into the cache."""
        marker = await conn.fetchval(
            "SELECT txid_snapshot_xmin(txid_current_snapshot()) % 4294967296"
        )
        rows = await conn.fetch(_CHANGED, self._marker)
        self.rows_read += len(rows)
        for row in rows:
            node = ComputeNode.from_row(row["node"])
            self._hosts[node.id] = HostState(node=node, service=Service.from_row(row["service"]))
        self._marker = int(marker)

    def _with_up(self, now: datetime) -> list[HostState]:
        oldest = now - timedelta(seconds=self.service_down_time)
        hosts = []
        for cached in self._hosts.values():
            seen = cached.service.last_seen_up
            up = not cached.service.forced_down and seen is not None and seen > oldest
            if up != cached.service.is_up:
                service = cached.service.model_copy(update={"is_up": up})
                cached = HostState(node=cached.node, service=service)  # noqa: PLW2901
            hosts.append(cached)
        return hosts

    async def candidates(self, conn: Connection, spec: RequestSpec) -> AsyncIterator[WeighedHost]:
        await self.refresh(conn)
        passed = self.filter_hosts(self._with_up(datetime.now(UTC)), spec)
        for candidate in self.spread(self.weigh_hosts(passed, spec)):
            yield candidate
