"""The search's workers draw seeds of both profiles."""

from __future__ import annotations

from devkit import model_search


def test_workers_alternate_the_parity_of_their_seeds() -> None:
    seeds = [model_search._random_seed(number) for number in range(6) for _ in range(20)]
    parities = {seed % 2 for seed in seeds[:20]}, {seed % 2 for seed in seeds[20:40]}
    assert parities == ({0}, {1})
    assert [seed % 2 for seed in seeds[::20]] == [0, 1, 0, 1, 0, 1]
    assert all(0 <= seed < 2**32 for seed in seeds)
    assert len(set(seeds)) > 100
