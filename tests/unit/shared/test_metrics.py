"""Metrics are served over HTTP only when asked, from the process's own registry."""

from __future__ import annotations

import socket
import urllib.request

from shared.metrics import Metrics


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_counters_are_served_in_prometheus_text() -> None:
    metrics = Metrics()
    metrics.min_version_queries.labels(binary="keel-compute").inc()
    port = _free_port()

    metrics.serve(f"127.0.0.1:{port}")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()

    assert 'keel_min_service_version_queries_total{binary="keel-compute"} 1.0' in text


def test_two_processes_worth_of_metrics_do_not_share_counters() -> None:
    first, second = Metrics(), Metrics()
    first.min_version_queries.labels(binary="keel-compute").inc()
    assert second.value("keel_min_service_version_queries_total", binary="keel-compute") == 0
