"""A simulated fleet: many complete compute agents in one process, to rehearse scale.

Each agent is the real keel-compute (:func:`services.compute.agent.start_agent`): its own
node identity file in ``<state dir>/<host>/``, its own service row and compute node, its
own queue ``compute.<service-uuid>``, its own heartbeats, and a fake virt driver of the
given size. Only the broker connection is shared: agents take turns on a few
connections (``agents_per_connection`` each) through :class:`SharedTransport`, because
one AMQP connection per agent would cost the broker and this process a connection,
socket and reply queue each (see ``bench/RESULTS.md`` for the measured difference).

Agents start ``start_concurrency`` at a time (all at once for a start-up storm). A
refusal of any agent stops the ones already started and is raised. :meth:`Fleet.stop`
stops every agent at once (each drains its in-flight work as keel-compute does), then
closes the connections.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from services.compute.agent import Agent, start_agent
from services.compute.virt import load_driver
from shared.config import Settings
from shared.rpc.amqp import AmqpTransport
from shared.rpc.transport import Consumer, DeadLetter, Handler, Transport

LOG = logging.getLogger(__name__)


class SharedTransport(Transport):
    """One agent's view of a transport it shares with other agents.

    ``connect`` connects the shared transport if nobody has; ``close`` stops only the
    consumers this view started and leaves the connection to its owner, the fleet.
    Calls and casts go through the shared transport's connection and reply queue.
    """

    def __init__(self, shared: Transport) -> None:
        self._shared = shared
        self._consumers: list[Consumer] = []

    async def connect(self) -> None:
        await self._shared.connect()

    async def close(self) -> None:
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.stop(0)

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        return await self._shared.call(topic, body, message_id=message_id, timeout=timeout)

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        await self._shared.cast(topic, body, message_id=message_id)

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        consumer = await self._shared.serve(topic, handler, prefetch=prefetch)
        self._consumers.append(consumer)
        return consumer

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        return await self._shared.dead_letters(limit, calls=calls)

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        return await self._shared.purge_dead_letters(calls=calls)


@dataclass(frozen=True)
class FleetSpec:
    """What to simulate: ``hosts`` agents named ``<prefix>-00001`` …, each of this size."""

    hosts: int
    prefix: str = "sim"
    state_dir: Path | None = None
    vcpus: int = 16
    memory_mb: int = 65536
    local_gb: int = 1000
    agents_per_connection: int = 100
    start_concurrency: int = 100

    def host(self, index: int) -> str:
        return f"{self.prefix}-{index + 1:05d}"


def agent_settings(settings: Settings, spec: FleetSpec, index: int) -> Settings:
    """The settings one agent of the fleet runs with: its own host and state directory."""
    host = spec.host(index)
    root = spec.state_dir or settings.state_dir
    compute = settings.compute.model_copy(
        update={
            "driver": "fake",
            "vcpus": spec.vcpus,
            "memory_mb": spec.memory_mb,
            "local_gb": spec.local_gb,
        }
    )
    return settings.model_copy(update={"host": host, "state_dir": root / host, "compute": compute})


class Fleet:
    def __init__(self, settings: Settings, spec: FleetSpec) -> None:
        self.settings = settings
        self.spec = spec
        self.agents: list[Agent] = []
        self._transports: list[AmqpTransport] = []

    def _transport_for(self, index: int) -> Transport:
        return SharedTransport(self._transports[index // self.spec.agents_per_connection])

    async def _connect(self) -> None:
        """Open the shared connections before any agent uses one."""
        per = max(self.spec.agents_per_connection, 1)
        for _ in range(-(-self.spec.hosts // per)):
            transport = AmqpTransport.from_settings(self.settings)
            await transport.connect()
            self._transports.append(transport)

    async def _start_one(self, index: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            settings = agent_settings(self.settings, self.spec, index)
            agent = await start_agent(settings, self._transport_for(index), load_driver(settings))
            self.agents.append(agent)

    async def start(self) -> None:
        """Start every agent; on a refusal, stop those started and raise it."""
        gate = asyncio.Semaphore(max(self.spec.start_concurrency, 1))
        LOG.info(
            "starting %d simulated compute agents (%s-00001 …), %d at a time",
            self.spec.hosts,
            self.spec.prefix,
            self.spec.start_concurrency,
        )
        try:
            await self._connect()
            async with asyncio.TaskGroup() as group:
                for index in range(self.spec.hosts):
                    group.create_task(self._start_one(index, gate))
        except BaseException:
            await self.stop()
            raise
        LOG.info("all %d simulated compute agents started", len(self.agents))

    async def stop(self) -> None:
        """Stop every agent (each drains its work), then close the shared connections."""
        agents, self.agents = self.agents, []
        await asyncio.gather(*(agent.stop() for agent in agents), return_exceptions=True)
        transports, self._transports = self._transports, []
        for transport in transports:
            await transport.close()
        LOG.info("stopped %d simulated compute agents", len(agents))
