"""The scheduler's view of the cloud for one request: load every host once, filter, weigh.

Host state comes from one query per request (every live compute node joined with its
service, up/down computed on the database clock), so the cost of a request does not grow
with round trips to the database as the cloud grows. Filters and weighers then work on
that snapshot in memory; the claim that follows re-checks capacity in the database, so
a snapshot that went stale while another scheduler claimed is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from services.scheduler.filters import HostFilter, default_filters
from services.scheduler.weighers import HostWeigher, default_weighers
from shared.db import compute_nodes
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


class HostManager:
    def __init__(
        self,
        *,
        service_down_time: float,
        filters: Sequence[HostFilter] | None = None,
        weighers: Sequence[HostWeigher] | None = None,
    ) -> None:
        self.service_down_time = service_down_time
        self.filters = list(default_filters() if filters is None else filters)
        self.weighers = list(default_weighers() if weighers is None else weighers)

    async def get_host_states(self, conn: Connection) -> list[HostState]:
        """Every live compute node with its service, in one query."""
        return await compute_nodes.host_states(conn, self.service_down_time)

    def filter_hosts(self, hosts: Sequence[HostState], spec: RequestSpec) -> list[HostState]:
        """The hosts every filter accepts, each filter running on the previous one's survivors.

        When no host remains, how many hosts each filter removed is logged at INFO, so an
        operator can tell why the request failed; otherwise at DEBUG.
        """
        remaining = list(hosts)
        results: list[FilterResult] = []
        for host_filter in self.filters:
            if not remaining:
                break
            start = len(remaining)
            remaining = [host for host in remaining if host_filter.host_passes(host, spec)]
            results.append(FilterResult(name=host_filter.name, start=start, end=len(remaining)))
        summary = ", ".join(str(result) for result in results) or "no compute hosts exist"
        extra = {"instance_uuid": str(spec.instance_uuid)}
        if remaining:
            LOG.debug(
                "filter results for instance %s: %s", spec.instance_uuid, summary, extra=extra
            )
        else:
            LOG.info(
                "filtering removed all hosts for instance %s; filter results: %s",
                spec.instance_uuid,
                summary,
                extra={**extra, "decision": "no_valid_host"},
            )
        return remaining

    def weigh_hosts(self, hosts: Sequence[HostState], spec: RequestSpec) -> list[WeighedHost]:
        """The hosts, best first: the sum of each weigher's normalised score times its multiplier.

        Hosts with equal weight keep their order (by compute node id), so the result is
        deterministic.
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
        LOG.debug(
            "weighed hosts for instance %s: %s",
            spec.instance_uuid,
            ", ".join(
                f"{w.host.node.host}/{w.host.node.hypervisor_hostname}={w.weight:.3f}"
                for w in weighed
            ),
        )
        return weighed
