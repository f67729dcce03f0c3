"""A running control plane for conductor tests: the real scheduler and conductor mains
against real PostgreSQL and RabbitMQ, plus an agent-side transport for stand-in agents.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from services.conductor.main import serve as serve_conductor
from services.conductor.rpcapi import ConductorAPI
from services.scheduler.main import serve as serve_scheduler
from services.scheduler.rpcapi import SchedulerAPI
from shared.config import RpcSettings, Settings
from shared.context import RequestContext
from shared.exceptions import NoValidHost, ServiceNotFound, Unroutable
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from shared.rpc.amqp import AmqpTransport
from shared.runtime import Lifecycle
from shared.versions import SERVICE_VERSION
from tests.broker import remove_exchange

#: Bound on waiting for something that should happen almost at once.
SOON = 20.0


@pytest.fixture
def settings(database_url: str, amqp_url: str, exchange: str) -> Settings:
    return Settings(
        database_url=database_url,
        transport_url=amqp_url,
        exchange=exchange,
        host="control-host",
        report_interval=0.5,
        rpc=RpcSettings(queue_expires=60, call_timeout=10, connect_timeout=10),
    )


@pytest.fixture
async def agent_transport(amqp_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    """The transport stand-in agents (and the test, as the API) use."""
    transport = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
    await transport.connect()
    yield transport
    await transport.close()
    await remove_exchange(exchange, ("conductor", "scheduler"))


async def wait_for_conductor(transport: AmqpTransport) -> None:
    """Until a conductor answers on the test's exchange."""
    conductor = ConductorAPI(transport, timeout=SOON)
    async with asyncio.timeout(SOON):
        while True:
            try:
                await conductor.service_heartbeat(
                    RequestContext(), service_uuid=uuid.uuid4(), version=SERVICE_VERSION
                )
            except Unroutable:
                await asyncio.sleep(0.05)
            except ServiceNotFound:
                return


async def wait_for_scheduler(transport: AmqpTransport) -> None:
    """Until a scheduler answers on the test's exchange."""
    scheduler = SchedulerAPI(transport, timeout=SOON)
    probe = RequestSpec(
        instance_uuid=uuid.uuid4(),
        project_id="p",
        user_id="u",
        flavor=FlavorSnapshot(flavorid="0", name="probe", vcpus=1, memory_mb=1, root_gb=0),
    )
    async with asyncio.timeout(SOON):
        while True:
            try:
                await scheduler.select_destinations(RequestContext(), probe)
            except Unroutable:
                await asyncio.sleep(0.05)
            except NoValidHost:
                return


@pytest.fixture
async def conductor(
    settings: Settings, agent_transport: AmqpTransport
) -> AsyncIterator[ConductorAPI]:
    """keel-scheduler and keel-conductor running; the conductor's client for agents and API."""
    lifecycle = Lifecycle()
    runs = [
        asyncio.create_task(serve_scheduler(settings, lifecycle)),
        asyncio.create_task(serve_conductor(settings, lifecycle)),
    ]
    try:
        await wait_for_conductor(agent_transport)
        await wait_for_scheduler(agent_transport)
        yield ConductorAPI(agent_transport, timeout=SOON)
    finally:
        lifecycle.stopping.set()
        await asyncio.gather(*runs)
