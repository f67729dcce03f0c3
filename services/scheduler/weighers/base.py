"""The protocol every scheduler weigher implements.

A weigher gives each host that passed the filters a raw score from its
:class:`~shared.objects.compute_node.HostState`. Raw scores are normalised across the
candidate hosts to ``0.0 … 1.0`` (so weighers with different units can be added up),
multiplied by the weigher's ``multiplier`` and summed; the highest total is tried first.
A negative multiplier turns a spreading weigher into a stacking one.

``sql_score`` is the raw score as an SQL expression over ``n``/``s`` (or ``None``): the
first weigher's orders the scheduler's candidate query, which reads only the best few
hosts; all weighers then score those few in Python.
"""

from __future__ import annotations

from typing import Protocol

from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec


class HostWeigher(Protocol):
    """Scores one candidate host for one request; higher is better before the multiplier."""

    #: Shown in logs, e.g. ``RamWeigher``.
    name: str
    multiplier: float

    def weigh(self, host: HostState, spec: RequestSpec) -> float: ...

    #: The raw score as an SQL expression, or ``None`` if it has none.
    sql_score: str | None
