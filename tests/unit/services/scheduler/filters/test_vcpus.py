from __future__ import annotations

import pytest

from services.scheduler.filters.vcpus import VcpuFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


@pytest.mark.parametrize(
    ("vcpus", "used", "ratio", "wanted", "passes"),
    [
        (4, 0, 1.0, 4, True),
        (4, 1, 1.0, 4, False),
        (4, 3, 1.0, 1, True),
        (4, 4, 1.0, 1, False),
        (4, 12, 4.0, 4, True),
        (4, 13, 4.0, 4, False),
        (2, 0, 1.5, 3, True),
    ],
)
def test_free_vcpus_count_the_allocation_ratio(
    vcpus: int, used: int, ratio: float, wanted: int, passes: bool
) -> None:
    host = make_host(vcpus=vcpus, vcpus_used=used, cpu_allocation_ratio=ratio)
    assert VcpuFilter().host_passes(host, make_spec(vcpus=wanted)) is passes
