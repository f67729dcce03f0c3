from __future__ import annotations

from services.scheduler.weighers.ram import RamWeigher
from tests.unit.services.scheduler.hosts import make_host, make_spec


def test_weight_is_usable_free_ram() -> None:
    host = make_host(memory_mb=4096, memory_mb_used=1024, ram_allocation_ratio=1.5)
    assert RamWeigher().weigh(host, make_spec()) == 4096 * 1.5 - 1024


def test_emptier_host_weighs_more() -> None:
    full = make_host("full", memory_mb=8192, memory_mb_used=6000)
    empty = make_host("empty", memory_mb=4096, memory_mb_used=0)
    spec = make_spec()
    assert RamWeigher().weigh(empty, spec) > RamWeigher().weigh(full, spec)
