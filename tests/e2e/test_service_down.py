"""An agent that stops heartbeating is reported down within the service down time."""

from __future__ import annotations

import time

import pytest

from tests.e2e.cloud import Cloud

pytestmark = pytest.mark.e2e

#: Beyond the down time itself: one report interval, and the client's own latency.
SLACK = 15.0


def compute_states(cloud: Cloud) -> dict[str, str]:
    services = cloud.openstack("compute", "service", "list", "--service", "keel-compute")
    return {s["Host"]: s["State"] for s in services}


def test_stopped_agent_is_reported_down(cloud: Cloud) -> None:
    assert compute_states(cloud) == {"compute1": "up", "compute2": "up"}

    assert cloud.processes["compute2"].stop() == 0

    deadline = time.monotonic() + cloud.config.service_down_time + SLACK
    states = compute_states(cloud)
    while states["compute2"] != "down" and time.monotonic() < deadline:
        time.sleep(1)
        states = compute_states(cloud)
    assert states == {"compute1": "up", "compute2": "down"}
    hypervisors = {
        h["Hypervisor Hostname"]: h["State"] for h in cloud.openstack("hypervisor", "list")
    }
    assert sorted(hypervisors.values()) == ["down", "up"]
