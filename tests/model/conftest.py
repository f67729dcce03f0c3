"""The world every model test runs in: a scratch database, one event loop of its own.

Hypothesis drives a state machine from synchronous rules, so the model's tests are
plain functions; the world gets an event loop of its own (not pytest-asyncio's), on
which every rule runs its coroutines to completion.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity

from services.api.servers import publish
from shared.rpc import server
from tests.model.machine import KeelMachine
from tests.model.runtime import Loop, LoopClock
from tests.model.scratch import scratch_pool
from tests.model.world import World, base_settings


def routes_once_per_class(
    read: Callable[[object], dict[str, Any]],
) -> Callable[[object], dict[str, Any]]:
    """keel's reading of an RPC endpoint's routes (``shared.rpc.server._routes``), done once
    per endpoint class: the model starts an agent's RPC server some ten times an example,
    and resolving the type hints of every method of its endpoint each time was a tenth of
    an example's time. The routes of another instance of the class are the same methods,
    bound to it (an endpoint whose instance carries coroutine functions of its own, or
    whose routes are not the class's methods, is read anew each time)."""
    known: dict[type, dict[str, tuple[Any, Any]]] = {}

    def own_coroutines(endpoint: object) -> bool:
        return any(
            inspect.iscoroutinefunction(v) for v in getattr(endpoint, "__dict__", {}).values()
        )

    def routes(endpoint: object) -> dict[str, Any]:
        cls = type(endpoint)
        if cls in known and not own_coroutines(endpoint):
            return {
                name: server._Route(func=types.MethodType(func, endpoint), request=request)
                for name, (func, request) in known[cls].items()
            }
        found = read(endpoint)
        methods = {
            name: route.func.__func__
            for name, route in found.items()
            if isinstance(route.func, types.MethodType) and route.func.__self__ is endpoint
        }
        if (
            len(methods) == len(found)
            and not own_coroutines(endpoint)
            and all(getattr(cls, name, None) is f for name, f in methods.items())
        ):
            known[cls] = {name: (methods[name], found[name].request) for name in found}
        return found

    return routes


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
    monkeypatch.setattr(server, "_routes", routes_once_per_class(server._routes))
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
