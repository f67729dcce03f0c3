"""The model-based test: Hypothesis searches operations and faults for a broken invariant.

Every run searches from a seed of its own, drawn at random and printed (``model: seed
N``), so CI explores new ground each time; ``make test-model SEED=N`` (or
``KEEL_MODEL_SEED=N``) runs the same search again. CI runs :data:`CI_EXAMPLES` examples;
``make test-model`` runs ``KEEL_MODEL_EXAMPLES`` and prints how many examples per second
it ran. The seed picks the profile too: an even one searches with soft delete on, an odd
one with it off (:func:`soft_delete_on`). A failure prints the seed and the shortest
sequence of steps Hypothesis found that breaks an invariant: keep it as an example in
``test_findings*.py``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Verbosity, seed, settings
from hypothesis.stateful import get_state_machine_test

from tests.model.machine import KeelMachine
from tests.model.runtime import Loop
from tests.model.world import RECLAIM_INTERVAL, World

pytestmark = pytest.mark.functional

CI_EXAMPLES = 300
#: Steps of one example at most: short examples shrink fast and cover more starts.
STEPS = 25


@pytest.fixture
def chosen_seed() -> int:
    """This search's seed (:func:`search_seed`), which also picks its profile."""
    return search_seed()


@pytest.fixture
def reclaim_interval(chosen_seed: int) -> float:
    """An even seed searches with soft delete on: a DELETE may keep the server, which the
    restore and forceDelete rules then act on. An odd one with soft delete off: every
    DELETE deletes (a terminate cast to the agent), as most clouds run."""
    return RECLAIM_INTERVAL if soft_delete_on(chosen_seed) else 0.0


def soft_delete_on(chosen: int) -> bool:
    """Whether the search from seed ``chosen`` runs with soft delete on."""
    return chosen % 2 == 0


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.debug if os.environ.get("KEEL_MODEL_TRACE_FILE") else Verbosity.normal,
    )


class SearchMachine(KeelMachine):
    """The machine as the search runs it: each example's cloud starts in its first step,
    which draws the agents' release (see :attr:`KeelMachine.begins_in_initialize`)."""

    begins_in_initialize = True


@contextlib.contextmanager
def collector_for_a_search() -> Iterator[None]:
    """Python's collector tuned for thousands of examples: what exists before the search
    (modules, keel's application, Hypothesis's strategies) lives as long as it, out of the
    collector's sight, and an example's many short-lived objects are collected less often.
    Full collections were a tenth of the search's time."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def search_seed() -> int:
    """``KEEL_MODEL_SEED`` if set, else a new one."""
    given = os.environ.get("KEEL_MODEL_SEED", "").strip()
    return int(given) if given else secrets.randbelow(2**32)


@pytest.mark.timeout(0)
def test_the_model_holds(model: tuple[World, Loop], chosen_seed: int) -> None:
    world, loop = model
    examples = int(os.environ.get("KEEL_MODEL_EXAMPLES", str(CI_EXAMPLES)))
    chosen = chosen_seed
    soft = "on" if soft_delete_on(chosen) else "off"
    print(f"\nmodel: seed {chosen}, soft delete {soft} (again: make test-model SEED={chosen})")
    SearchMachine.world, SearchMachine.runner, SearchMachine.examples = world, loop, 0
    SearchMachine.first_failure = None
    search = seed(chosen)(get_state_machine_test(SearchMachine, settings=_settings(examples)))
    started = time.monotonic()
    try:
        with collector_for_a_search():
            search()
    except BaseException:
        first = SearchMachine.first_failure
        print(f"\nmodel: seed {chosen}: example {first} broke an invariant (then shrunk)")
        raise
    finally:
        elapsed = time.monotonic() - started
        ran = SearchMachine.examples
        print(f"\nmodel: {ran} examples in {elapsed:.1f}s, {ran / elapsed:.1f} examples/s")
        let_past = world.rt.inflight.let_past
        print(f"model: {let_past} database step(s) let past a row lock (replays may differ)")
