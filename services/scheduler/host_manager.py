"""The scheduler's view of the cloud for one request: read the best few hosts, filter, weigh.

A request does not read every host. The filters' SQL conditions and the first weigher's
SQL score select the best ``page_size`` hosts in one indexed query
(:mod:`shared.db.host_candidates`), so its cost does not grow with the cloud. Every
filter then runs again in Python on those hosts and every weigher scores them; a page
whose hosts all fail (a filter with no SQL form, or claims lost to other requests)
leads to the next page. The claim that follows re-checks capacity in the database, so a
candidate that went stale while another scheduler claimed is harmless.

Concurrent requests are spread as Nova's ``host_subset_size`` does: the first host
tried is picked at random among the best ``host_subset_size``, so schedulers that read
the same ranking do not all race for its first host.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from services.scheduler.filters import (
    HostFilter,
    RequestedDestinationFilter,
    ServerGroupFilter,
    default_filters,
)
from services.scheduler.weighers import HostWeigher, default_weighers
from shared.db import host_candidates
from shared.db.host_candidates import HostSql
from shared.db.pool import Connection
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class FilterResult(BaseModel):
    """How many hosts one filter was given and let through."""

    model_config = ConfigDict(frozen=True)

    name: str
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.name}: (start: {self.start}, end: {self.end})"


@dataclass(frozen=True)
class WeighedHost:
    host: HostState
    weight: float


def _normalise(values: Sequence[float]) -> list[float]:
    """Map raw scores onto ``0.0 … 1.0``; all equal scores count as 0.0."""
    low, high = min(values), max(values)
    if high == low:
        return [0.0 for _ in values]
    return [(value - low) / (high - low) for value in values]


#: Hosts read per candidate page beyond the random subset: room for lost claims.
PAGE_RESERVE = 8


class HostManager:
    def __init__(
        self,
        *,
        service_down_time: float,
        filters: Sequence[HostFilter] | None = None,
        weighers: Sequence[HostWeigher] | None = None,
        host_subset_size: int = 1,
        rng: random.Random | None = None,
    ) -> None:
        if host_subset_size < 1:
            raise ValueError("host_subset_size must be at least 1")
        self.service_down_time = service_down_time
        self.filters = list(default_filters() if filters is None else filters)
        self.weighers = list(default_weighers() if weighers is None else weighers)
        self.host_subset_size = host_subset_size
        self.page_size = host_subset_size + PAGE_RESERVE
        self._rng = rng or random.Random()

    def _order(self) -> str:
        """ORDER BY for the candidate query: the first weigher's SQL score, then node id."""
        first = self.weighers[0] if self.weighers else None
        score = getattr(first, "sql_score", None) if first is not None else None
        if first is None or score is None:
            return "n.id"
        # Matches the index (score DESC, id) read forwards, or backwards when stacking.
        return f"{score} DESC, n.id" if first.multiplier >= 0 else f"{score} ASC, n.id DESC"

    def filters_for(self, spec: RequestSpec) -> list[HostFilter]:
        """The filters this request goes through: all of them, or, for a forced
        destination, only the one that narrows the candidates to it and the server
        group's policy."""
        wanted = spec.requested_destination
        if wanted is None:
            return self.filters
        narrowing: list[HostFilter] = [
            f for f in self.filters if isinstance(f, RequestedDestinationFilter)
        ]
        if wanted.forced:
            # A forced host skips the filters, never the server group's policy.
            group: list[HostFilter] = [
                f for f in self.filters if isinstance(f, ServerGroupFilter)
            ] or [ServerGroupFilter()]
            return [*(narrowing or [RequestedDestinationFilter()]), *group]
        return self.filters if narrowing else [RequestedDestinationFilter(), *self.filters]

    def _conditions(self, spec: RequestSpec, sql: HostSql) -> list[str | None]:
        return [f.sql_condition(spec, sql) for f in self.filters_for(spec)]

    async def candidates(self, conn: Connection, spec: RequestSpec) -> AsyncIterator[WeighedHost]:
        """Hosts to try claiming on, in order, read a page at a time as they are needed.

        Ends without yielding anything when no host passes the filters; that is logged
        at INFO with how many hosts each filter left.
        """
        sql = HostSql(self.service_down_time)
        conditions = [c for c in self._conditions(spec, sql) if c is not None]
        order = self._order()
        offset = 0
        found = 0
        while True:
            page = await host_candidates.top_candidates(
                conn, sql, conditions, order=order, limit=self.page_size, offset=offset
            )
            passed, _ = self.apply_filters(page, spec)
            weighed = self.spread(self.weigh_hosts(passed, spec))
            found += len(weighed)
            for candidate in weighed:
                yield candidate
            if len(page) < self.page_size:
                break
            offset += len(page)
        if not found:
            await self._log_no_host(conn, spec)

    async def _log_no_host(self, conn: Connection, spec: RequestSpec) -> None:
        """INFO: how many hosts each filter left, counted over the whole cloud."""
        sql = HostSql(self.service_down_time)
        total, left = await host_candidates.filter_counts(conn, sql, self._conditions(spec, sql))
        results: list[FilterResult] = []
        start = total
        for host_filter, end in zip(self.filters_for(spec), left, strict=True):
            results.append(FilterResult(name=host_filter.name, start=start, end=end))
            start = end
        self._log_results(spec, results, passed=False, total=total)

    def spread(self, weighed: list[WeighedHost]) -> list[WeighedHost]:
        """The best ``host_subset_size`` hosts in random order, then the rest, best first."""
        subset = min(self.host_subset_size, len(weighed))
        if subset <= 1:
            return weighed
        head = weighed[:subset]
        self._rng.shuffle(head)
        return head + weighed[subset:]

    def apply_filters(
        self, hosts: Sequence[HostState], spec: RequestSpec
    ) -> tuple[list[HostState], list[FilterResult]]:
        """The hosts every filter accepts, and how many each filter was given and kept."""
        remaining = list(hosts)
        results: list[FilterResult] = []
        for host_filter in self.filters_for(spec):
            if not remaining:
                break
            start = len(remaining)
            remaining = [host for host in remaining if host_filter.host_passes(host, spec)]
            results.append(FilterResult(name=host_filter.name, start=start, end=len(remaining)))
        return remaining, results

    def filter_hosts(self, hosts: Sequence[HostState], spec: RequestSpec) -> list[HostState]:
        """The hosts every filter accepts, each filter running on the previous one's survivors.

        When no host remains, how many hosts each filter removed is logged at INFO, so an
        operator can tell why the request failed; otherwise at DEBUG.
        """
        remaining, results = self.apply_filters(hosts, spec)
        self._log_results(spec, results, passed=bool(remaining), total=len(hosts))
        return remaining

    def _log_results(
        self, spec: RequestSpec, results: Sequence[FilterResult], *, passed: bool, total: int
    ) -> None:
        extra = {"instance_uuid": str(spec.instance_uuid)}
        if passed:
            if LOG.isEnabledFor(logging.DEBUG):
                summary = ", ".join(str(result) for result in results)
                LOG.debug(
                    "filter results for instance %s: %s", spec.instance_uuid, summary, extra=extra
                )
            return
        summary = ", ".join(str(r) for r in results) if total else "no compute hosts exist"
        LOG.info(
            "filtering removed all hosts for instance %s; filter results: %s",
            spec.instance_uuid,
            summary,
            extra={**extra, "decision": "no_valid_host"},
        )

    def weigh_hosts(self, hosts: Sequence[HostState], spec: RequestSpec) -> list[WeighedHost]:
        """The hosts, best first: the sum of each weigher's normalised score times its multiplier.

        Hosts with equal weight keep their order, so the result is deterministic.
        """
        if not hosts:
            return []
        totals = [0.0 for _ in hosts]
        for weigher in self.weighers:
            raw = [weigher.weigh(host, spec) for host in hosts]
            for index, score in enumerate(_normalise(raw)):
                totals[index] += weigher.multiplier * score
        weighed = sorted(
            (
                WeighedHost(host=host, weight=total)
                for host, total in zip(hosts, totals, strict=True)
            ),
            key=lambda candidate: candidate.weight,
            reverse=True,
        )
        if LOG.isEnabledFor(logging.DEBUG):
            LOG.debug(
                "weighed hosts for instance %s: %s",
                spec.instance_uuid,
                ", ".join(
                    f"{w.host.node.host}/{w.host.node.hypervisor_hostname}={w.weight:.3f}"
                    for w in weighed
                ),
            )
        return weighed
