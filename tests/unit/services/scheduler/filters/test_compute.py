from __future__ import annotations

from services.scheduler.filters.compute import ComputeFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


def test_enabled_up_host_passes() -> None:
    assert ComputeFilter().host_passes(make_host(), make_spec())


def test_disabled_host_is_rejected() -> None:
    assert not ComputeFilter().host_passes(make_host(disabled=True), make_spec())


def test_forced_down_host_is_rejected_even_with_a_recent_heartbeat() -> None:
    assert not ComputeFilter().host_passes(make_host(forced_down=True, is_up=True), make_spec())


def test_host_without_recent_heartbeat_is_rejected() -> None:
    assert not ComputeFilter().host_passes(make_host(is_up=False), make_spec())
