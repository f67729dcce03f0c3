from __future__ import annotations

from services.scheduler.filters.availability_zone import AvailabilityZoneFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


def test_no_requested_zone_accepts_every_zone() -> None:
    host = make_host(availability_zone="az-west")
    assert AvailabilityZoneFilter().host_passes(host, make_spec(availability_zone=None))


def test_requested_zone_accepts_hosts_in_it() -> None:
    host = make_host(availability_zone="az-west")
    assert AvailabilityZoneFilter().host_passes(host, make_spec(availability_zone="az-west"))


def test_requested_zone_rejects_hosts_elsewhere() -> None:
    host = make_host(availability_zone="nova")
    assert not AvailabilityZoneFilter().host_passes(host, make_spec(availability_zone="az-west"))
