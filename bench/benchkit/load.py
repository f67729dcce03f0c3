"""Run one operation many times at a fixed concurrency and time every run of it.

``C`` worker tasks take the next operation index from one shared counter until all
``N`` have been started, so exactly ``C`` operations are in flight until the tail. Each
operation's wall-clock latency is taken with :func:`time.perf_counter`. Expected keel
errors (:class:`~shared.exceptions.KeelError`, e.g. ``NoValidHost``) count as failures,
by class name; anything else is a bug in the benchmark and stops it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from shared.exceptions import KeelError

#: One unit of work; its argument is the operation's index, ``0 … N-1``.
Operation = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class LoadResult:
    """What one run of :func:`run_load` measured."""

    operations: int
    concurrency: int
    #: Seconds from the first operation started to the last one finished.
    elapsed: float
    #: Seconds each successful operation took, in completion order.
    latencies: tuple[float, ...]
    #: Failed operations by error class name.
    failures: Mapping[str, int]

    @property
    def succeeded(self) -> int:
        return len(self.latencies)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def rate(self) -> float:
        """Operations finished (successful or not) per second."""
        return self.operations / self.elapsed if self.elapsed > 0 else math.inf

    def percentile_ms(self, percent: float) -> float:
        """The nearest-rank percentile of successful latencies, in milliseconds."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        rank = max(math.ceil(percent / 100 * len(ordered)), 1)
        return ordered[rank - 1] * 1000


async def _worker(
    operation: Operation,
    indexes: Iterator[int],
    latencies: list[float],
    failures: Counter[str],
) -> None:
    for index in indexes:
        started = time.perf_counter()
        try:
            await operation(index)
        except KeelError as exc:
            failures[type(exc).__name__] += 1
            continue
        latencies.append(time.perf_counter() - started)


async def run_load(operation: Operation, operations: int, concurrency: int) -> LoadResult:
    """Run ``operation`` ``operations`` times with ``concurrency`` of them in flight."""
    if operations < 1 or concurrency < 1:
        raise ValueError("operations and concurrency must be at least 1")
    indexes = iter(range(operations))
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    workers = min(concurrency, operations)
    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(workers):
            group.create_task(_worker(operation, indexes, latencies, failures))
    elapsed = time.perf_counter() - started
    return LoadResult(
        operations=operations,
        concurrency=concurrency,
        elapsed=elapsed,
        latencies=tuple(latencies),
        failures=dict(failures),
    )
