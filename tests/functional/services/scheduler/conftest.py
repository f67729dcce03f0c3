"""Fixtures for the scheduler against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import RPC_VERSION, TOPIC, SchedulerAPI
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.broker import remove_exchange

OpenTransport = Callable[[], Awaitable[AmqpTransport]]


@pytest.fixture
async def open_transport(amqp_url: str, exchange: str) -> AsyncIterator[OpenTransport]:
    """Opens connected transports on the test's exchange, as separate processes would."""
    opened: list[AmqpTransport] = []

    async def _open() -> AmqpTransport:
        transport = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
        await transport.connect()
        opened.append(transport)
        return transport

    yield _open
    for transport in opened:
        await transport.close()
    await remove_exchange(exchange, ("scheduler",))


async def serve_scheduler(pool: asyncpg.Pool, open_transport: OpenTransport) -> RPCServer:
    """A keel-scheduler endpoint served on the test's exchange."""
    manager = SchedulerManager(pool, HostManager(service_down_time=60))
    server = RPCServer(await open_transport(), TOPIC, manager, version=RPC_VERSION)
    await server.start(prefetch=16)
    return server


@pytest.fixture
async def scheduler(
    db_pool: asyncpg.Pool, open_transport: OpenTransport
) -> AsyncIterator[SchedulerAPI]:
    server = await serve_scheduler(db_pool, open_transport)
    yield SchedulerAPI(await open_transport(), timeout=30)
    await server.stop(drain_timeout=10)
