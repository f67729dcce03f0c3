"""Prometheus metrics of one keel process.

Every process builds one :class:`Metrics` (in :func:`shared.runtime.run`) and hands it to
what counts things. The counters live in the object's own registry, not in a global one,
and are served over HTTP only when ``KEEL_METRICS_BIND=HOST:PORT`` is set; metrics are off
by default.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

LOG = logging.getLogger(__name__)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.min_version_queries = Counter(
            "keel_min_service_version_queries",
            "Queries of the minimum service version of a binary (the cache missed)",
            ["binary"],
            registry=self.registry,
        )
        self.messages = Counter(
            "keel_rpc_messages",
            "RPC messages handled, by topic, method and how they were settled",
            ["topic", "method", "settled"],
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "keel_rpc_dead_lettered",
            "RPC messages this process dead-lettered, by topic and kind of failure",
            ["topic", "failure"],
            registry=self.registry,
        )
        self.self_fences = Counter(
            "keel_self_fences",
            "Times this compute host's fence fired (powered its guests off) because the "
            "agent's lease ran out: KEEL_FENCING__SELF_FENCE_AFTER seconds without an "
            "answered heartbeat",
            registry=self.registry,
        )
        self.fence_armed = Gauge(
            "keel_fence_armed",
            "1 while this compute host's fence runs and enforces the agent's lease, else 0 "
            "(the host is then never evacuated without an operator)",
            registry=self.registry,
        )
        self.fence_lease_left = Gauge(
            "keel_fence_lease_seconds_left",
            "Seconds until this compute host's fence lease runs out unless renewed",
            registry=self.registry,
        )
        self.copies_refused = Counter(
            "keel_copies_refused",
            "Guest copies, results and reports refused because their copy token is not the "
            "server's current one, by what was refused",
            ["what"],
            registry=self.registry,
        )

        self.hosts_fenced = Gauge(
            "keel_hosts_fenced",
            "Compute hosts down whose guests are known to be off (their fence's lease ran "
            "out, or forced down without a fence), as this conductor's last recovery sweep "
            "saw them",
            registry=self.registry,
        )
        self.auto_evacuations_started = Counter(
            "keel_auto_evacuations_started",
            "Evacuations this conductor started on its own (KEEL_RECOVERY__AUTO_EVACUATE)",
            registry=self.registry,
        )
        self.auto_evacuations_refused = Counter(
            "keel_auto_evacuations_refused",
            "Automatic evacuations this conductor did not start, by reason (per host or "
            "server and sweep)",
            ["reason"],
            registry=self.registry,
        )

    def serve(self, bind: str) -> None:
        """Serve the metrics at ``http://HOST:PORT/`` from a background thread."""
        host, _, port = bind.rpartition(":")
        start_http_server(int(port), addr=host, registry=self.registry)
        LOG.info("serving Prometheus metrics on http://%s/metrics", bind)

    def value(self, name: str, **labels: str) -> float:
        """The current value of a sample (for tests and benchmarks)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found
