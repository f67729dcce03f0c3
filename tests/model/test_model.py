"""The model-based test: Hypothesis searches operations and faults for a broken invariant.

CI runs :data:`CI_EXAMPLES` examples from a fixed seed (the same ones every run);
``make test-model`` runs ``KEEL_MODEL_EXAMPLES`` (5,000 there) and prints how many
examples per second it ran. A failure prints the shortest sequence of steps Hypothesis
found that breaks an invariant: keep it as an example in ``test_findings.py``.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, Verbosity, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import KeelMachine
from tests.model.runtime import Loop
from tests.model.world import World

pytestmark = pytest.mark.functional

CI_EXAMPLES = 300
#: Steps of one example at most: short examples shrink fast and cover more starts.
STEPS = 25


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.debug if os.environ.get("KEEL_MODEL_TRACE_FILE") else Verbosity.normal,
    )


@pytest.mark.timeout(0)
def test_the_model_holds(model: tuple[World, Loop]) -> None:
    world, loop = model
    examples = int(os.environ.get("KEEL_MODEL_EXAMPLES", str(CI_EXAMPLES)))
    KeelMachine.world, KeelMachine.runner, KeelMachine.examples = world, loop, 0
    started = time.monotonic()
    try:
        run_state_machine_as_test(KeelMachine, settings=_settings(examples))
    finally:
        elapsed = time.monotonic() - started
        ran = KeelMachine.examples
        print(f"\nmodel: {ran} examples in {elapsed:.1f}s, {ran / elapsed:.1f} examples/s")
