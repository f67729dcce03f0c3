"""The world every model test runs in: a scratch database, one event loop of its own.

Hypothesis drives a state machine from synchronous rules, so the model's tests are
plain functions; the world gets an event loop of its own (not pytest-asyncio's), on
which every rule runs its coroutines to completion.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tenacity

from services.api.servers import publish
from tests.model.machine import KeelMachine
from tests.model.runtime import Loop, LoopClock
from tests.model.world import World, base_settings, scratch_pool


@pytest.fixture
def reclaim_interval() -> float:
    """``KEEL_RECLAIM_INSTANCE_INTERVAL`` of the model's cloud: 0, a DELETE deletes (the
    findings' examples were written so); the search turns soft delete on."""
    return 0.0


@pytest.fixture
def model(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reclaim_interval: float
) -> Iterator[tuple[World, Loop]]:
    # keel-api pauses between two attempts at an unconfirmed cast; in the model no time
    # passes but what the model advances, so the pause is only a wait.
    monkeypatch.setattr(publish, "PAUSE", 0.0)
    loop = Loop()
    # Retry windows count the model loop's time, in which skipped backoffs pass.
    monkeypatch.setattr(tenacity, "time", LoopClock(loop.loop))
    pool = loop.run(scratch_pool(database_url))
    settings = base_settings(database_url, tmp_path).model_copy(
        update={"reclaim_instance_interval": reclaim_interval}
    )
    world = World(pool, settings, tmp_path)
    loop.run(world.prepare())
    try:
        yield world, loop
    finally:
        loop.run(world.close())
        loop.run(pool.close())
        loop.close()


@pytest.fixture
def m(model: tuple[World, Loop]) -> KeelMachine:
    """A fresh cloud; each test ends with ``m.teardown()``: settle, then quiescence."""
    world, loop = model
    KeelMachine.world, KeelMachine.runner = world, loop
    return KeelMachine()
