"""An agent's RPC leaves a RabbitMQ node that died, on either event loop.

keel's processes run on asyncio's loop or on uvloop (``KEEL_EVENT_LOOP``). Here a
transport shaped like an agent's — serving a topic of its own, calling another topic
every half second as heartbeats do, with the HA stage's AMQP heartbeat — runs on a loop
of each kind in a thread of its own while its RabbitMQ node is SIGKILLed. On either
loop it must report the loss, move to another node and have its calls answered again
before a host fence's lease would run out.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import pytest
import uvloop

from devkit.rabbit_cluster import RabbitCluster, RabbitNode
from shared.context import RequestContext
from shared.rpc.amqp import AmqpTransport
from shared.rpc.client import RPCClient
from shared.rpc.server import RPCServer
from tests.ha.test_rpc_cluster import VERSION, Endpoint, Text, nodes_url

pytestmark = [pytest.mark.ha, pytest.mark.timeout(300)]

T = TypeVar("T")

LoopKind = Literal["asyncio", "uvloop"]
#: The HA stage's AMQP heartbeat, seconds.
HEARTBEAT = 2
#: Seconds from the kill to the first answered call on another node: a host fence's
#: lease in the HA stage (the kernel resets a killed node's connections, so the loss
#: is known at once; the rest is connecting again and the next call).
BACK_WITHIN = 20.0
TOPIC = "ha-loops"


class LoopThread:
    """An event loop of one kind running in a thread of its own."""

    def __init__(self, kind: LoopKind) -> None:
        self.kind = kind
        self.loop = uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name=f"{kind}-loop", daemon=True
        )
        self._thread.start()

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this thread's loop; its result, awaited from another."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class Agent:
    """A transport serving a topic and calling TOPIC every half second, on ``thread``."""

    def __init__(self, thread: LoopThread, url: str, exchange: str) -> None:
        self.thread = thread
        self.transport = AmqpTransport(
            url, exchange, queue_expires=120, connect_timeout=30, heartbeat=HEARTBEAT
        )
        #: Why the transport said its connection was lost, each time it did.
        self.losses: list[str] = []
        #: The monotonic time of each answered call.
        self.answered: list[float] = []
        #: Why the last call that failed did.
        self.last_failure = ""
        self._beating: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.thread.run(self._start())

    async def _start(self) -> None:
        self.transport.on_connection_lost(self.losses.append)
        await self.transport.connect()
        await RPCServer(self.transport, f"{TOPIC}-agent", Endpoint(), version=VERSION).start()
        self._beating = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        caller = RPCClient(self.transport, TOPIC, version_cap=VERSION, timeout=2.0)
        while True:
            try:
                await caller.call(
                    RequestContext(), "echo", Text(text="beat"), version=VERSION, returns=Text
                )
            except Exception as exc:
                # What matters is when calls are answered again.
                self.last_failure = f"{type(exc).__name__}: {exc}"
            else:
                self.answered.append(time.monotonic())
            await asyncio.sleep(0.5)

    def answered_since(self, moment: float) -> float | None:
        """When the first call after ``moment`` was answered, if one was."""
        return next((at for at in self.answered if at > moment), None)

    async def close(self) -> None:
        await self.thread.run(self._close())

    async def _close(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
        await self.transport.close()


@pytest.fixture(params=["asyncio", "uvloop"])
async def agent(
    request: pytest.FixtureRequest, rabbit: RabbitCluster, cluster_exchange: str
) -> AsyncIterator[Agent]:
    """An agent on a loop of the parameter's kind, connected to any node."""
    thread = LoopThread(request.param)
    running = Agent(thread, rabbit.url(), cluster_exchange)
    try:
        await running.start()
        yield running
        await asyncio.wait_for(running.close(), 30)
    finally:
        thread.stop()


@asynccontextmanager
async def conductor_beside(
    rabbit: RabbitCluster, exchange: str, node: RabbitNode
) -> AsyncIterator[None]:
    """A server of TOPIC connected only to the nodes other than ``node``."""
    others = [other for other in rabbit.nodes if other is not node]
    transport = AmqpTransport(nodes_url(rabbit, others), exchange, queue_expires=120)
    await transport.connect()
    try:
        await RPCServer(transport, TOPIC, Endpoint(), version=VERSION).start()
        yield
    finally:
        await transport.close()


async def answered_after(agent: Agent, moment: float, timeout: float) -> float:
    """When the first of ``agent``'s calls after ``moment`` was answered, waiting for it
    up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (answered := agent.answered_since(moment)) is None:
        assert time.monotonic() < deadline, (
            f"no call answered on {agent.thread.kind} within {timeout:g}s; the last failed "
            f"with {agent.last_failure}; losses reported: {agent.losses}"
        )
        await asyncio.sleep(0.1)
    return answered


async def test_an_agent_leaves_its_killed_node_on_either_event_loop(
    agent: Agent, rabbit: RabbitCluster, cluster_exchange: str
) -> None:
    assert agent.transport.node is not None
    node = rabbit.by_address(agent.transport.node)
    async with conductor_beside(rabbit, cluster_exchange, node):
        await answered_after(agent, time.monotonic(), timeout=30)
        killed = time.monotonic()
        await rabbit.kill(node)

        back = await answered_after(agent, killed, timeout=BACK_WITHIN + 10)
        assert back - killed < BACK_WITHIN, (agent.thread.kind, back - killed, agent.losses)
        assert agent.losses, "the loss of the connection was not reported"
        assert agent.transport.node not in (None, node.address)
