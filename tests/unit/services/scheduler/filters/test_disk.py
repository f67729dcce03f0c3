from __future__ import annotations

import pytest

from services.scheduler.filters.disk import DiskFilter
from tests.unit.services.scheduler.hosts import make_host, make_spec


@pytest.mark.parametrize(
    ("local_gb", "used", "ratio", "root_and_ephemeral", "passes"),
    [
        (100, 0, 1.0, (100, 0), True),
        (100, 0, 1.0, (80, 20), True),
        (100, 0, 1.0, (80, 21), False),
        (100, 90, 1.0, (10, 0), True),
        (100, 91, 1.0, (10, 0), False),
        (100, 100, 2.0, (50, 50), True),
        (100, 150, 2.0, (40, 20), False),
    ],
)
def test_root_and_ephemeral_disk_must_fit_with_the_allocation_ratio(
    local_gb: int, used: int, ratio: float, root_and_ephemeral: tuple[int, int], passes: bool
) -> None:
    host = make_host(local_gb=local_gb, local_gb_used=used, disk_allocation_ratio=ratio)
    root_gb, ephemeral_gb = root_and_ephemeral
    spec = make_spec(root_gb=root_gb, ephemeral_gb=ephemeral_gb)
    assert DiskFilter().host_passes(host, spec) is passes
