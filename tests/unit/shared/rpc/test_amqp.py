"""What the RabbitMQ transport does before it has a broker (no network here).

Its behaviour against a broker is covered by tests/functional/shared/test_rpc_contract.py.
"""

from __future__ import annotations

import asyncio

import pytest

from shared.exceptions import MessagingError, MessagingTimeout
from shared.rpc.amqp import AmqpTransport, _Publisher
from shared.rpc.transport import IncomingMessage, Settlement

URL = "amqp://keel:s3cret@broker.example:5672/keel"


def test_reply_queue_is_named_under_the_exchange_and_per_transport() -> None:
    first = AmqpTransport(URL, "keel-a")
    second = AmqpTransport(URL, "keel-a")
    assert first.reply_queue.startswith("keel-a.reply.")
    assert first.reply_queue != second.reply_queue


async def test_unconnected_transport_refuses_to_publish() -> None:
    transport = AmqpTransport(URL, "keel-a")
    with pytest.raises(MessagingError, match="not connected") as caught:
        await transport.call("conductor", b"{}", message_id="m1", timeout=1)
    assert "s3cret" not in caught.value.message
    with pytest.raises(MessagingError, match="not connected"):
        await transport.cast("conductor", b"{}", message_id="m2")


async def test_unconnected_transport_refuses_to_serve() -> None:
    transport = AmqpTransport(URL, "keel-a")

    async def handler(message: IncomingMessage) -> Settlement:
        raise AssertionError("an unconnected transport delivered a message")

    with pytest.raises(MessagingError, match="not connected"):
        await transport.serve("conductor", handler, prefetch=1)
    with pytest.raises(MessagingError, match="not connected"):
        await transport.dead_letters()


async def test_closing_an_unconnected_transport_is_harmless() -> None:
    transport = AmqpTransport(URL, "keel-a")
    await transport.close()
    await transport.close()


class _ClosingExchange:
    """An exchange whose channel closes while the first publish waits for its
    confirmation (what aiormq does to the confirmations it still owes)."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.published = 0

    async def publish(self, message: object, routing_key: str, mandatory: bool) -> None:
        self.published += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.published == 1:
            raise asyncio.CancelledError


class _OpenChannel:
    is_closed = False


class _Connected:
    """A broker connection that is always there."""

    connection = object()

    async def ready(self, timeout: float) -> object:
        return self.connection


def _publishing_into(exchange: _ClosingExchange) -> AmqpTransport:
    transport = AmqpTransport(URL, "keel-a")
    transport.broker = _Connected()  # type: ignore[assignment]
    transport._publisher = _Publisher(_OpenChannel(), exchange, exchange)  # type: ignore[arg-type]
    return transport


async def test_a_channel_closing_under_a_publish_sends_it_again_and_is_no_cancellation() -> None:
    """Leaked, the cancellation ended the heartbeat loop of an agent for good."""
    exchange = _ClosingExchange()
    transport = _publishing_into(exchange)

    await transport.cast("conductor", b"{}", message_id="m1")

    assert exchange.published == 2
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0


async def test_a_call_that_times_out_while_publishing_still_times_out() -> None:
    transport = _publishing_into(_ClosingExchange(hang=True))

    with pytest.raises(MessagingTimeout, match=r"no reply from conductor within 0\.1s"):
        await transport.call("conductor", b"{}", message_id="m1", timeout=0.1)
