"""The model-based test over RabbitMQ: what the in-memory run shows, once on a real broker.

The same machine, with every process on a real :class:`~shared.rpc.amqp.AmqpTransport`
(a new test exchange per example; see :mod:`tests.model.amqp`). Fewer examples: a real
broker is slower, and its faults are what RabbitMQ itself does — a lost acknowledgement
is a nack with requeue, a duplicate is a second publish, a kill closes the connection.
Calls to a process that is gone wait for their (short) timeout, so the control
processes are not killed here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Verbosity, settings
from hypothesis.stateful import initialize, run_state_machine_as_test

from devkit.broker import remove_exchange
from services.api.servers import publish
from tests.model.amqp import AmqpRuntime
from tests.model.machine import KeelMachine
from tests.model.runtime import Loop
from tests.model.scratch import scratch_pool
from tests.model.world import World, base_settings

pytestmark = pytest.mark.functional

EXAMPLES = int(os.environ.get("KEEL_MODEL_AMQP_EXAMPLES", "20"))
#: Seconds a call waits over RabbitMQ (its message's TTL too): short, so that a call to
#: a killed agent ends soon.
CALL_TIMEOUT = 2.0
TOPICS = ("conductor", "scheduler")
#: Print every step of every example (as test_model.py does with a trace file).
TRACING = bool(os.environ.get("KEEL_MODEL_TRACE_FILE"))


class AmqpMachine(KeelMachine):
    """The machine without the rules a real broker cannot replay promptly; each example
    starts with a server built (few examples: each should exercise something)."""

    @initialize()
    def a_server(self) -> None:
        self.create(on=0)
        self.deliver_all()

    def kill_control(self, which: str) -> None:
        """Not a rule here: agents' calls to a killed conductor would wait out their timeout."""


@pytest.fixture
def amqp_model(
    database_url: str, amqp_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[World, Loop]]:
    monkeypatch.setattr(publish, "PAUSE", 0.0)
    loop = Loop()
    pool = loop.run(scratch_pool(database_url))
    runtime = AmqpRuntime(pool, amqp_url, CALL_TIMEOUT)
    world = World(
        pool,
        base_settings(database_url, tmp_path, call_timeout=CALL_TIMEOUT),
        tmp_path,
        runtime=runtime,
    )
    loop.run(world.prepare())
    try:
        yield world, loop
    finally:
        loop.run(world.close())
        loop.run(pool.close())
        for exchange in runtime.exchanges:
            agents = [f"compute.{s}" for s in world.agent_services]
            loop.run(remove_exchange(exchange, [*TOPICS, *agents], url=amqp_url))
        loop.close()


@pytest.mark.timeout(0)
def test_the_model_holds_over_rabbitmq(amqp_model: tuple[World, Loop]) -> None:
    world, loop = amqp_model
    AmqpMachine.world, AmqpMachine.runner, AmqpMachine.examples = world, loop, 0
    started = time.monotonic()
    try:
        run_state_machine_as_test(
            AmqpMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=20,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
                verbosity=Verbosity.debug
                if os.environ.get("KEEL_MODEL_TRACE_FILE")
                else Verbosity.normal,
            ),
        )
    finally:
        elapsed = time.monotonic() - started
        print(f"\nmodel over RabbitMQ: {AmqpMachine.examples} examples in {elapsed:.1f}s")
