"""What keel's benchmarks share: a concurrent load driver and one way of printing figures.

The benchmark scripts live one level up (``bench/*.py``, each run by ``make bench``);
this package is not a benchmark itself, so ``make bench`` does not run it.
"""

from __future__ import annotations

from benchkit.load import LoadResult, Operation, run_load
from benchkit.report import figures, not_available, report, target

__all__ = [
    "LoadResult",
    "Operation",
    "figures",
    "not_available",
    "report",
    "run_load",
    "target",
]
