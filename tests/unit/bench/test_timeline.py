"""Downtime and MTTR as the fault benchmark computes them from what clients saw."""

from __future__ import annotations

import math

from benchkit.clients import Iteration, Probe
from benchkit.timeline import downtime, mttr, timeline


def probes(*events: tuple[float, bool]) -> list[Probe]:
    return [Probe(at, ok, "200" if ok else "503") for at, ok in events]


def test_downtime_runs_from_the_first_failure_after_the_fault_to_the_last() -> None:
    seen = probes((1, False), (10, True), (11, False), (12, False), (13, True), (15.5, False))
    assert downtime(seen, since=5) == 4.5
    assert downtime(seen, since=15) == 0.0
    assert downtime(probes((6, True), (7, True)), since=5) == 0.0


def iterations(*spans: tuple[float, float]) -> list[Iteration]:
    return [Iteration(started, ended, True) for started, ended in spans]


def test_mttr_is_when_latency_is_first_back_within_one_and_a_half_times_the_median() -> None:
    before = iterations((0, 1), (1, 2), (2, 3))  # 1 s each
    slow = iterations((10, 13), (11, 14))  # 3 s: above 1.5 s
    quick = iterations((14, 15), (15, 16), (16, 17))
    assert mttr([*before, *slow, *quick], fault_at=10, window=1) == 4.0
    assert mttr([*before, *quick], fault_at=10, window=1) == 0.0


def test_a_lone_slow_iteration_does_not_count_against_a_wider_window() -> None:
    before = iterations((0, 1), (1, 2), (2, 3))
    after = iterations((10, 11), (10, 14), (11, 12), (12, 13))
    assert mttr([*before, *after], fault_at=10, window=3) == 0.0


def test_a_slow_run_after_recovering_is_not_the_faults() -> None:
    before = iterations((0, 1), (1, 2), (2, 3))
    after = iterations((10, 13), (13, 14), (14, 15), (20, 24))
    assert mttr([*before, *after], fault_at=10, window=1) == 3.0


def test_no_iteration_before_the_fault_gives_no_mttr() -> None:
    assert math.isnan(mttr(iterations((10, 11)), fault_at=5, window=1))


def test_the_timeline_names_what_failed() -> None:
    runs = [*iterations((0, 1)), Iteration(6, 9, False, "create 503"), *iterations((7, 8))]
    seen = timeline(runs, probes((6.5, False), (8.5, True)), fault_at=5, window=1)
    assert seen.failed_iterations == 1
    assert seen.failures == "create 503: 1"
    assert seen.slowest == 3.0
    assert seen.median_before == 1.0
