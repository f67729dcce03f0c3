"""Prometheus metrics of one keel process.

Every process builds one :class:`Metrics` (in :func:`shared.runtime.run`) and hands it to
what counts things. The counters live in the object's own registry, not in a global one,
and are served over HTTP only when ``KEEL_METRICS_BIND=HOST:PORT`` is set; metrics are off
by default.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LOG = logging.getLogger(__name__)

#: Buckets (seconds) of the latencies measured: a database query or an RPC handler, from
#: a millisecond to a minute.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Buckets (seconds) of a boot, from the request to the guest running.
BOOT_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


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

        self._latencies()
        self._fleet()

    def _latencies(self) -> None:
        self.rpc_handle_seconds = Histogram(
            "keel_rpc_handle_seconds",
            "Seconds this process took to handle an RPC message, from its arrival to its "
            "settlement, by topic and method",
            ["topic", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.db_query_seconds = Histogram(
            "keel_db_query_seconds",
            "Seconds one SQL command of this process took, by its first word (select, "
            "insert, update, delete, other)",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.boots = Counter(
            "keel_boots",
            "Builds this conductor recorded as ended, by result (active, error)",
            ["result"],
            registry=self.registry,
        )
        self.boot_seconds = Histogram(
            "keel_boot_seconds",
            "Seconds from a server's create request to its guest running, for the builds "
            "this conductor recorded ACTIVE (by the database's clock)",
            buckets=BOOT_BUCKETS,
            registry=self.registry,
        )

    def _fleet(self) -> None:
        """What keel-api reads from the database every report interval (the same figures
        from every keel-api of a deployment: aggregate them with ``max``)."""
        self.compute_hosts = Gauge(
            "keel_compute_hosts",
            "Compute hosts by state: up, down, fenced (silent past its fence's lease and the "
            "margin), forced_down",
            ["state"],
            registry=self.registry,
        )
        self.compute_hosts_disabled = Gauge(
            "keel_compute_hosts_disabled",
            "Compute hosts disabled for scheduling",
            registry=self.registry,
        )
        self.servers = Gauge(
            "keel_servers",
            "Live servers by status (ACTIVE, BUILD, SHUTOFF, ERROR, ...)",
            ["status"],
            registry=self.registry,
        )
        self.moves_open = Gauge(
            "keel_moves_open",
            "Moves not yet ended, by type and status",
            ["type", "status"],
            registry=self.registry,
        )
        self.moves_ended_last_hour = Gauge(
            "keel_moves_ended_last_hour",
            "Moves that reached an end in the last hour, by type and final status",
            ["type", "status"],
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
