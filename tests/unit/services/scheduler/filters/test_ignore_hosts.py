from __future__ import annotations

from services.scheduler.filters.ignore_hosts import IgnoreHostsFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


def test_ignored_host_is_rejected() -> None:
    spec = make_spec(ignore_hosts=["host1"])
    assert not IgnoreHostsFilter().host_passes(make_host("host1"), spec)


def test_other_hosts_pass() -> None:
    spec = make_spec(ignore_hosts=["host1"])
    assert IgnoreHostsFilter().host_passes(make_host("host2"), spec)
    assert IgnoreHostsFilter().host_passes(make_host("host1"), make_spec())
