"""Filtering and weighing on hand-built host states (no database)."""

from __future__ import annotations

import logging

import pytest

from services.scheduler.host_manager import HostManager
from services.scheduler.weighers.ram import RamWeigher
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec
from tests.unit.services.scheduler.hosts import make_host, make_spec


class _DiskWeigher:
    """A second weigher in other units, to show scores are normalised before summing."""

    name = "DiskWeigher"
    #: Weighed in Python only, as a weigher without an SQL form.
    sql_score: str | None = None

    def __init__(self, multiplier: float = 1.0) -> None:
        self.multiplier = multiplier

    def weigh(self, host: HostState, spec: RequestSpec) -> float:
        return host.node.free_disk_gb


def _names(hosts: list[HostState]) -> list[str]:
    return [host.node.host for host in hosts]


def test_default_filters_keep_only_hosts_that_fit() -> None:
    hosts = [
        make_host("ok"),
        make_host("disabled", disabled=True),
        make_host("down", is_up=False),
        make_host("forced", forced_down=True),
        make_host("small", memory_mb=256),
        make_host("few-cpus", vcpus=1, vcpus_used=1),
        make_host("no-disk", local_gb=1),
        make_host("elsewhere", availability_zone="other"),
        make_host("ignored"),
    ]
    spec = make_spec(memory_mb=512, root_gb=2, availability_zone="nova", ignore_hosts=["ignored"])
    passed = HostManager(service_down_time=60).filter_hosts(hosts, spec)
    assert _names(passed) == ["ok"]


def test_no_host_left_is_logged_at_info_with_the_filter_that_removed_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hosts = [make_host("a", memory_mb=1024), make_host("b", memory_mb=1024)]
    spec = make_spec(memory_mb=4096)
    with caplog.at_level(logging.INFO, logger="services.scheduler"):
        passed = HostManager(service_down_time=60).filter_hosts(hosts, spec)
    assert passed == []
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(
        str(spec.instance_uuid) in m and "RamFilter: (start: 2, end: 0)" in m for m in messages
    )


def test_no_hosts_at_all_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="services.scheduler"):
        passed = HostManager(service_down_time=60).filter_hosts([], make_spec())
    assert passed == []
    assert any("no compute hosts exist" in r.getMessage() for r in caplog.records)


def test_successful_filtering_logs_nothing_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="services.scheduler"):
        HostManager(service_down_time=60).filter_hosts([make_host()], make_spec())
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_ram_weigher_spreads_most_free_ram_first() -> None:
    hosts = [
        make_host("busy", memory_mb=8192, memory_mb_used=7000),
        make_host("empty", memory_mb=8192),
        make_host("half", memory_mb=8192, memory_mb_used=4096),
    ]
    weighed = HostManager(service_down_time=60).weigh_hosts(hosts, make_spec())
    assert [w.host.node.host for w in weighed] == ["empty", "half", "busy"]
    assert weighed[0].weight == pytest.approx(1.0)
    assert weighed[-1].weight == pytest.approx(0.0)


def test_negative_multiplier_stacks() -> None:
    hosts = [make_host("empty", memory_mb=8192), make_host("busy", memory_mb_used=12000)]
    manager = HostManager(service_down_time=60, weighers=[RamWeigher(multiplier=-1.0)])
    weighed = manager.weigh_hosts(hosts, make_spec())
    assert [w.host.node.host for w in weighed] == ["busy", "empty"]


def test_equal_weights_keep_the_given_order() -> None:
    hosts = [make_host("first"), make_host("second"), make_host("third")]
    weighed = HostManager(service_down_time=60).weigh_hosts(hosts, make_spec())
    assert [w.host.node.host for w in weighed] == ["first", "second", "third"]
    assert {w.weight for w in weighed} == {0.0}


def test_weighers_are_normalised_before_they_are_summed() -> None:
    # RAM in MB would swamp disk in GB if raw scores were added; normalised, they balance.
    ram_rich = make_host("ram-rich", memory_mb=65536, local_gb=100)
    disk_rich = make_host("disk-rich", memory_mb=60000, local_gb=1000)
    manager = HostManager(
        service_down_time=60, weighers=[RamWeigher(), _DiskWeigher(multiplier=2.0)]
    )
    weighed = manager.weigh_hosts([ram_rich, disk_rich], make_spec())
    assert [w.host.node.host for w in weighed] == ["disk-rich", "ram-rich"]
    assert weighed[0].weight == pytest.approx(2.0)
    assert weighed[1].weight == pytest.approx(1.0)


def test_weighing_no_hosts_gives_nothing() -> None:
    assert HostManager(service_down_time=60).weigh_hosts([], make_spec()) == []
