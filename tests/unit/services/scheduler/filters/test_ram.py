from __future__ import annotations

import pytest

from services.scheduler.filters.ram import RamFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


@pytest.mark.parametrize(
    ("memory_mb", "used", "ratio", "wanted", "passes"),
    [
        (2048, 0, 1.0, 2048, True),
        (2048, 1, 1.0, 2048, False),
        (2048, 1536, 1.0, 512, True),
        (2048, 1537, 1.0, 512, False),
        (2048, 2048, 1.5, 1024, True),
        (2048, 2049, 1.5, 1024, False),
        (1000, 0, 0.5, 501, False),
    ],
)
def test_free_ram_counts_the_allocation_ratio(
    memory_mb: int, used: int, ratio: float, wanted: int, passes: bool
) -> None:
    host = make_host(memory_mb=memory_mb, memory_mb_used=used, ram_allocation_ratio=ratio)
    assert RamFilter().host_passes(host, make_spec(memory_mb=wanted)) is passes
