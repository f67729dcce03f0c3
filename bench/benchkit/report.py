"""How benchmarks print: a human line and a JSON line per measurement.

The human line is ``label  key=value key=value …``: plain pairs read well on a terminal
and are easy to pick out of a log with ``grep``. The JSON line after it carries the same
figures as an object with ``"bench"`` set to the label, for scripts
(``grep '^{' | jq``). Every figure carries its unit in its key (``_ms``, ``/s``, ``_mb``).

Targets are printed, never asserted: :func:`target` prints ``PASS`` or ``FAIL`` against
one, and the benchmark goes on.
"""

from __future__ import annotations

import json
import math

from benchkit.load import LoadResult

#: The latency percentiles every load line shows.
PERCENTILES = (50, 95, 99)


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 100 else f"{value:.2f}"
    return str(value)


def _json(value: object) -> object:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 3)
    if isinstance(value, bool | int | str) or value is None:
        return value
    return str(value)


def report(label: str, figures: dict[str, object]) -> None:
    """Print one measurement: the human line, then the JSON line; ``figures`` keep order."""
    pairs = " ".join(f"{key}={_text(value)}" for key, value in figures.items())
    print(f"{label:<18} {pairs}", flush=True)
    record = {"bench": label, **{key: _json(value) for key, value in figures.items()}}
    print(json.dumps(record), flush=True)


def target(name: str, value: float, *, at_most: float | None = None, at_least: float | None = None,
           unit: str = "") -> bool:  # fmt: skip
    """Print whether ``value`` meets the issue's target; return the verdict."""
    passed = not math.isnan(value)
    if at_most is not None:
        passed = passed and value <= at_most
        wanted = f"<= {at_most:g}{unit}"
    else:
        assert at_least is not None
        passed = passed and value >= at_least
        wanted = f">= {at_least:g}{unit}"
    report(
        "target",
        {"name": name, "value": value, "wanted": wanted, "result": "PASS" if passed else "FAIL"},
    )
    return passed


def not_available(label: str, why: str) -> None:
    """A benchmark whose subject does not exist yet in this code base."""
    report(label, {"result": "not available yet", "why": why})


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
