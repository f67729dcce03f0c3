"""Fixtures for the scheduler against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import pytest

from shared.rpc.amqp import AmqpTransport

OpenTransport = Callable[[], Awaitable[AmqpTransport]]


async def forget_exchange(url: str, exchange: str, topics: tuple[str, ...]) -> None:
    """Delete what a test declared on the broker (unused queues would expire anyway)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in (exchange, f"{exchange}.dlx"):
            await channel.exchange_delete(name)
        for queue in (f"{exchange}.dead-letter", *(f"{exchange}.{t}" for t in topics)):
            await channel.queue_delete(queue)


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
    await forget_exchange(amqp_url, exchange, ("scheduler",))
