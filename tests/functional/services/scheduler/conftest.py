"""Fixtures for the scheduler against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from shared.rpc.amqp import AmqpTransport
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
