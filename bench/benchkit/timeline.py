"""Downtime and time to recover, from what clients saw around a fault.

The reliability method of OpenStack's test plans (Rally boot-and-delete under os-faults):

* **downtime** — seconds during which requests failed: from the first failed request
  after the fault to the last one, as OpenStack's reliability reports count it (0 when
  none failed, or only one);
* **MTTR** — seconds from the fault until boot-and-delete is back to its usual speed:
  until the first run of ``window`` consecutive iterations (by the time they ended)
  whose median is within 1.5 times the median before the fault; the end of the last
  iteration before that run. 0 if the first run after the fault already is. (A slow
  run later on, once it had recovered, is the machine's noise, not the fault's.)
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from benchkit.clients import Iteration, Probe

#: Latency counts as recovered within this factor of the median before the fault.
RECOVERED = 1.5


@dataclass(frozen=True)
class Timeline:
    downtime: float
    mttr: float
    #: Median boot-and-delete before the fault and after it (seconds).
    median_before: float
    median_after: float
    iterations: int
    failed_iterations: int
    failed_requests: int
    #: The longest boot-and-delete after the fault (seconds).
    slowest: float
    #: What failed, by kind (``create 503: 4``), most frequent first.
    failures: str

    def figures(self) -> dict[str, object]:
        return {
            "downtime_s": round(self.downtime, 1),
            "mttr_s": round(self.mttr, 1),
            "median_before_s": round(self.median_before, 2),
            "median_after_s": round(self.median_after, 2),
            "iterations": self.iterations,
            "failed_iterations": self.failed_iterations,
            "failed_requests": self.failed_requests,
            "slowest_s": round(self.slowest, 1),
            "failures": self.failures,
        }


def downtime(probes: Sequence[Probe], since: float) -> float:
    """Seconds from the first failed request after ``since`` to the last one."""
    failed = [probe.at for probe in probes if not probe.ok and probe.at >= since]
    return max(failed) - min(failed) if failed else 0.0


def mttr(iterations: Sequence[Iteration], fault_at: float, window: int) -> float:
    """See the module docstring."""
    before = [i.latency for i in iterations if i.ended <= fault_at]
    if not before:
        return float("nan")
    limit = RECOVERED * statistics.median(before)
    after = sorted((i for i in iterations if i.ended > fault_at), key=lambda i: i.ended)
    slow_until = fault_at
    for start in range(len(after)):
        run = after[start : start + window]
        if statistics.median(i.latency for i in run) <= limit:
            break
        slow_until = after[start].ended
    return slow_until - fault_at


def timeline(
    iterations: Sequence[Iteration], probes: Sequence[Probe], fault_at: float, window: int
) -> Timeline:
    before = [i.latency for i in iterations if i.ended <= fault_at]
    after = [i.latency for i in iterations if i.started >= fault_at]
    return Timeline(
        downtime=downtime(probes, fault_at),
        mttr=mttr(iterations, fault_at, window),
        median_before=statistics.median(before) if before else float("nan"),
        median_after=statistics.median(after) if after else float("nan"),
        iterations=len(iterations),
        failed_iterations=sum(1 for i in iterations if not i.ok),
        failed_requests=sum(1 for p in probes if not p.ok and p.at >= fault_at),
        slowest=max((i.latency for i in iterations if i.ended > fault_at), default=0.0),
        failures=", ".join(
            f"{what}: {count}"
            for what, count in Counter(i.failure for i in iterations if not i.ok).most_common()
        )
        or "none",
    )
