"""How benchmarks print: one line per measurement, ``label  key=value key=value …``.

Plain ``key=value`` pairs read well on a terminal and are easy to pick out of a log with
``grep`` and ``awk``; every figure carries its unit in its key (``_ms``, ``/s``).
"""

from __future__ import annotations

from benchkit.load import LoadResult

#: The latency percentiles every load line shows.
PERCENTILES = (50, 95, 99)


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 100 else f"{value:.2f}"
    return str(value)


def report(label: str, figures: dict[str, object]) -> None:
    """Print one measurement line; ``figures`` keep their order."""
    pairs = " ".join(f"{key}={_text(value)}" for key, value in figures.items())
    print(f"{label:<18} {pairs}", flush=True)


def figures(result: LoadResult, *, noun: str) -> dict[str, object]:
    """The standard figures of one load run; ``noun`` names the operation (``requests``)."""
    shown: dict[str, object] = {
        noun: result.operations,
        "concurrency": result.concurrency,
        "ok": result.succeeded,
        "failed": result.failed,
        f"{noun}/s": result.rate,
    }
    for percent in PERCENTILES:
        shown[f"p{percent}_ms"] = result.percentile_ms(percent)
    for name, count in sorted(result.failures.items()):
        shown[f"failed_{name}"] = count
    return shown
