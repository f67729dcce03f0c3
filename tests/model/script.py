"""Scripted examples: the model's rules run in a fixed order (``test_findings*.py`` and
``test_crash_points.py``), each step followed by the per-step invariants."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.model.machine import KeelMachine
from tests.model.world import LEASE_RUNS_OUT

#: The three hosts, by index.
A, B, C = 0, 1, 2
__all__ = ["LEASE_RUNS_OUT", "A", "B", "C", "Steps", "past_the_lease"]


class Steps:
    """Runs machine steps and checks the per-step invariants after each."""

    def __init__(self, machine: KeelMachine) -> None:
        self.m = machine

    def __getattr__(self, name: str) -> Callable[..., Any]:
        step = getattr(self.m, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            self.m.every_step()
            return result

        return run


def past_the_lease(s: Steps) -> None:
    """Time passes until the fence lease of a host forced down has run out; the
    conductor's sweep sends its held evacuations on."""
    s.advance(LEASE_RUNS_OUT)
    s.sweep()
    s.deliver_all()
