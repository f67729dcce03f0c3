"""What RabbitMQ lets a per-agent user do, with the permissions keel gives it.

The user is made through the management API exactly as ``keel-manage agent credentials``
makes it. Its agent can do all an agent does — check the exchanges, declare, bind and
consume its own queue, call the conductor, answer calls, dead-letter — and the broker
refuses the rest: reading another queue, binding its queue to another topic, publishing
to another topic, declaring the shared exchanges.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from uuid import UUID

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel
from aiormq.exceptions import ChannelAccessRefused
from yarl import URL

from shared.exceptions import MessagingError
from shared.rpc.agent_users import user_for
from shared.rpc.amqp import AmqpTransport
from shared.rpc.amqp_topology import Topology, routing_key
from shared.rpc.transport import IncomingMessage, Settle, Settlement
from tests.broker import AMQP_URL, agent_user, remove_exchange

pytestmark = pytest.mark.functional

SOON = 10.0


@pytest.fixture
async def control(amqp_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    """The control plane's transport: it declares the exchanges and serves the conductor."""
    transport = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10)
    await transport.connect()
    yield transport
    await transport.close()
    await remove_exchange(exchange, ("conductor", "scheduler"))


@pytest.fixture
def service_uuid() -> UUID:
    return uuid.uuid4()


@pytest.fixture
async def agent_url(exchange: str, service_uuid: UUID) -> AsyncIterator[str]:
    async with agent_user(exchange, service_uuid) as url:
        yield url


async def answer(message: IncomingMessage) -> Settlement:
    return Settlement(Settle.ACK, b"%s" % (message.user_id or "").encode())


async def test_an_agent_user_does_what_an_agent_does(
    control: AmqpTransport, agent_url: str, exchange: str, service_uuid: UUID
) -> None:
    await control.serve("conductor", answer, prefetch=4)
    agent = AmqpTransport(agent_url, exchange, queue_expires=60, connect_timeout=10)
    await agent.connect()
    try:
        assert not agent.declares_topology
        own_topic = f"compute.{service_uuid}"
        await agent.serve(own_topic, answer, prefetch=4)
        # It calls the conductor, which sees who it is...
        seen = await agent.call("conductor", b"{}", message_id="up", timeout=SOON)
        assert seen == user_for(service_uuid).encode()
        # ...and answers the control plane's calls on its own queue.
        back = await control.call(own_topic, b"{}", message_id="down", timeout=SOON)
        assert back == b"guest"
        # A message its server cannot handle goes to the dead-letter exchange.
        dead = IncomingMessage(body=b"junk", message_id="junk")
        assert await agent.dead_letter(own_topic, dead, "test")
    finally:
        await agent.close()
    letters = await control.dead_letters()
    assert [letter.message_id for letter in letters] == ["junk"]


async def refused(url: str, action: Callable[[AbstractChannel], Awaitable[object]]) -> str:
    """Run ``action`` on a channel of a new connection as ``url``; the broker's refusal."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        with pytest.raises(ChannelAccessRefused) as caught:
            await action_then_check(channel, action)
    return str(caught.value)


async def action_then_check(
    channel: AbstractChannel, action: Callable[[AbstractChannel], Awaitable[object]]
) -> None:
    await action(channel)
    # A refused publish closes the channel; the next command on it says why.
    await asyncio.sleep(0.2)
    await channel.declare_exchange("amq.topic", passive=True)


async def test_the_broker_refuses_an_agent_user_what_is_not_its_own(
    control: AmqpTransport, agent_url: str, exchange: str
) -> None:
    topology = Topology(exchange)
    other = f"compute.{uuid.uuid4()}"
    await control.serve(other, answer, prefetch=4)

    async def consume_conductor(channel: AbstractChannel) -> None:
        await control.serve("conductor", answer, prefetch=4)
        queue = await channel.declare_queue(topology.queue_name("conductor"), passive=True)
        await queue.consume(answer)  # type: ignore[arg-type]

    async def consume_other(channel: AbstractChannel) -> None:
        queue = await channel.declare_queue(topology.queue_name(other), passive=True)
        await queue.get()

    async def declare_exchange(channel: AbstractChannel) -> None:
        await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)

    async def delete_other(channel: AbstractChannel) -> None:
        await channel.queue_delete(topology.queue_name(other))

    def publish(key: str) -> Callable[[AbstractChannel], Awaitable[object]]:
        async def send(channel: AbstractChannel) -> None:
            target = await channel.get_exchange(exchange, ensure=False)
            user = URL(agent_url).user
            await target.publish(aio_pika.Message(b"{}", user_id=user), routing_key=key)

        return send

    assert "queue" in await refused(agent_url, consume_conductor)
    assert "queue" in await refused(agent_url, consume_other)
    assert "exchange" in await refused(agent_url, declare_exchange)
    assert "queue" in await refused(agent_url, delete_other)
    assert "topic" in await refused(agent_url, publish(routing_key("call", "scheduler")))
    assert "topic" in await refused(agent_url, publish(routing_key("cast", other)))


async def test_an_agent_user_cannot_bind_its_queue_to_another_topic(
    control: AmqpTransport, agent_url: str, exchange: str, service_uuid: UUID
) -> None:
    topology = Topology(exchange)
    own_queue = topology.queue_name(f"compute.{service_uuid}")

    async def bind_to_conductor(channel: AbstractChannel) -> None:
        queue = await channel.declare_queue(
            own_queue, durable=True, arguments=topology.topic_queue_arguments()
        )
        await queue.bind(exchange, routing_key=routing_key("call", "conductor"))

    try:
        assert "topic 'call.conductor'" in await refused(agent_url, bind_to_conductor)
    finally:
        connection = await aio_pika.connect(control.url)
        async with connection:
            await (await connection.channel()).queue_delete(own_queue)


async def test_an_agent_user_waits_a_while_for_the_control_plane_to_declare_the_exchange(
    exchange: str, service_uuid: UUID
) -> None:
    async with agent_user(exchange, service_uuid) as url:
        agent = AmqpTransport(url, exchange, connect_timeout=3)
        waiting = asyncio.create_task(agent.connect())
        await asyncio.sleep(0.5)
        assert not waiting.done()
        # Once the control plane has declared the exchanges, the agent goes on.
        control = AmqpTransport(AMQP_URL, exchange, queue_expires=60, connect_timeout=10)
        await control.connect()
        try:
            await asyncio.wait_for(waiting, 10)
            await agent.close()
        finally:
            await control.close()
            await remove_exchange(exchange)
        late = AmqpTransport(url, f"{exchange}-never", connect_timeout=1)
        with pytest.raises(MessagingError, match="start keel-conductor first"):
            await late.connect()
