"""keel's queues on a real RabbitMQ: a classic queue left by an older keel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import pytest

from shared.exceptions import MessagingError
from shared.rpc.amqp import AmqpTransport
from shared.rpc.transport import IncomingMessage, Settle, Settlement
from tests.broker import remove_exchange
from tests.polling import wait_until

pytestmark = pytest.mark.functional

TOPIC = "conductor"


async def _ack(message: IncomingMessage) -> Settlement:
    return Settlement(Settle.ACK)


@pytest.fixture
async def transport(amqp_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    opened = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
    await opened.connect()
    yield opened
    await opened.close()
    await remove_exchange(exchange, (TOPIC,))


async def _classic_queue(amqp_url: str, name: str, messages: int) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments={"x-expires": 60000})
        for number in range(messages):
            await channel.default_exchange.publish(
                aio_pika.Message(f"old {number}".encode()), routing_key=name
            )


async def _queue_type(amqp_url: str, name: str) -> tuple[int | None, str]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        # A passive declare does not say the type; a quorum-only argument does.
        try:
            await channel.declare_queue(
                name, durable=True, arguments={"x-queue-type": "classic", "x-expires": 60000}
            )
        except aio_pika.exceptions.ChannelPreconditionFailed:
            return queue.declaration_result.message_count, "quorum"
        return queue.declaration_result.message_count, "classic"


async def test_empty_classic_queue_is_replaced_by_a_quorum_queue(
    transport: AmqpTransport, amqp_url: str, exchange: str
) -> None:
    name = f"{exchange}.{TOPIC}"
    await _classic_queue(amqp_url, name, messages=0)

    consumer = await transport.serve(TOPIC, _ack, prefetch=1)
    await consumer.stop(1)

    assert await _queue_type(amqp_url, name) == (0, "quorum")


async def test_classic_queue_holding_messages_is_refused_with_what_to_do(
    transport: AmqpTransport, amqp_url: str, exchange: str
) -> None:
    name = f"{exchange}.{TOPIC}"
    await _classic_queue(amqp_url, name, messages=2)

    with pytest.raises(MessagingError) as refused:
        await transport.serve(TOPIC, _ack, prefetch=1)

    message = refused.value.message
    assert f"queue {name} exists on the broker with other settings" in message
    assert "holding 2 message(s)" in message
    assert f"rabbitmqctl delete_queue {name}" in message
    assert await _queue_type(amqp_url, name) == (2, "classic")


async def test_a_quorum_queue_declared_without_a_group_size_is_kept_with_its_messages(
    transport: AmqpTransport, amqp_url: str, exchange: str
) -> None:
    """What an older keel left: the same quorum queue, without x-quorum-initial-group-size
    (RabbitMQ refuses to declare it again with one). It is served as it is."""
    name = transport.topology.queue_name(TOPIC)
    arguments = transport.topology.topic_queue_arguments()
    del arguments["x-quorum-initial-group-size"]
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments=arguments)
        await channel.default_exchange.publish(aio_pika.Message(b"left"), routing_key=name)

    seen: list[bytes] = []

    async def keep(message: IncomingMessage) -> Settlement:
        seen.append(message.body)
        return Settlement(Settle.ACK)

    consumer = await transport.serve(TOPIC, keep, prefetch=1)
    await wait_until(holding(lambda: seen == [b"left"]), what="the old message", timeout=10)
    await consumer.stop(1)


def holding(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def holds() -> bool:
        return check()

    return holds
