"""Who sent a message, as RabbitMQ vouches for it: the AMQP ``user_id``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest

from shared.rpc.amqp import AmqpTransport
from shared.rpc.amqp_topology import Topology, routing_key
from shared.rpc.transport import IncomingMessage, Settle, Settlement
from tests.broker import remove_exchange

pytestmark = pytest.mark.functional

TOPIC = "conductor"
SOON = 10.0


@pytest.fixture
async def transport(amqp_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    opened = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
    await opened.connect()
    yield opened
    await opened.close()
    await remove_exchange(exchange, (TOPIC,))


async def test_every_cast_and_call_names_its_broker_user(transport: AmqpTransport) -> None:
    seen: asyncio.Queue[IncomingMessage] = asyncio.Queue()

    async def record(message: IncomingMessage) -> Settlement:
        await seen.put(message)
        return Settlement(Settle.ACK, b'{"ok": true}' if message.is_call else None)

    await transport.serve(TOPIC, record, prefetch=4)
    await transport.cast(TOPIC, b"{}", message_id="cast-1")
    reply = await transport.call(TOPIC, b"{}", message_id="call-1", timeout=SOON)
    first = await asyncio.wait_for(seen.get(), SOON)
    second = await asyncio.wait_for(seen.get(), SOON)
    assert transport.user == "guest"
    assert (first.user_id, second.user_id) == ("guest", "guest")
    assert reply == b'{"ok": true}'


async def test_a_forged_user_id_is_refused_by_the_broker(
    transport: AmqpTransport, amqp_url: str, exchange: str
) -> None:
    seen: asyncio.Queue[IncomingMessage] = asyncio.Queue()

    async def record(message: IncomingMessage) -> Settlement:
        await seen.put(message)
        return Settlement(Settle.ACK)

    await transport.serve(TOPIC, record, prefetch=4)
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(Topology(exchange).exchange, ensure=False)
        forged = aio_pika.Message(b"{}", user_id="keel-agent-somebody-else")
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="user_id"):
            await target.publish(forged, routing_key=routing_key("cast", TOPIC))
    await transport.cast(TOPIC, b"{}", message_id="honest")
    delivered = await asyncio.wait_for(seen.get(), SOON)
    assert delivered.message_id == "honest"
    assert seen.empty()
