"""A topic queue consumed on RabbitMQ: one channel, each message in its own task.

Part of :class:`~shared.rpc.amqp.AmqpTransport`, which attaches every consumer to each
connection it opens (:meth:`TopicConsumer.attach`). When the broker cancels a consumer
(its queue moved to another leader or was deleted), the consumer attaches again on the
same connection by itself, with jittered backoff. A message whose handler is still
running when the connection drops cannot be settled any more: the broker delivers it
again (handlers are idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)
from aiormq.exceptions import AMQPError, ChannelInvalidStateError
from pamqp.commands import Basic

from shared.exceptions import MessagingError
from shared.rpc.amqp_connection import backoff
from shared.rpc.amqp_topology import delivery_count
from shared.rpc.transport import Consumer, Handler, IncomingMessage, Settle, Settlement

if TYPE_CHECKING:
    from shared.rpc.amqp import AmqpTransport

LOG = logging.getLogger(__name__)

#: Broker-side failures of an operation on a channel or connection that is going away.
CHANNEL_ERRORS = (AMQPError, ChannelInvalidStateError, OSError)


def _incoming(message: AbstractIncomingMessage) -> IncomingMessage:
    return IncomingMessage(
        body=message.body,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        redelivered=bool(message.redelivered),
        delivery_count=delivery_count(message),
        user_id=message.user_id,
    )


class TopicConsumer(Consumer):
    """One topic queue consumed on its own channel; each message in its own task.

    Attached to each connection the transport opens, and again on the same connection
    when the broker cancels it.
    """

    def __init__(
        self, transport: AmqpTransport, topic: str, handler: Handler, prefetch: int
    ) -> None:
        self._transport = transport
        self._topic = topic
        self._handler = handler
        self._prefetch = prefetch
        self._name = transport.topology.queue_name(topic)
        self._channel: AbstractChannel | None = None
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        #: The connection the consumer is attached to.
        self._attached_to: AbstractConnection | None = None
        self._attaching = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    async def attach(self, connection: AbstractConnection) -> None:
        """Consume the topic's queue on ``connection`` (nothing to do if it already does)."""
        async with self._attaching:
            if self._stopped or self._attached_to is connection:
                return
            await self._close_channel()
            topology = self._transport.topology
            await topology.ensure_topic_queue(connection, self._topic)
            channel = await connection.channel(publisher_confirms=False)
            try:
                await channel.set_qos(prefetch_count=self._prefetch)
                queue = await topology.bind_topic_queue(channel, self._topic)
                underlay = await channel.get_underlay_channel()
                underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
                self._tag = await queue.consume(self._on_message)
            except BaseException:
                if not channel.is_closed:
                    await channel.close()
                raise
            self._channel, self._queue, self._attached_to = channel, queue, connection

    def detach(self) -> None:
        """The connection is gone, and the channel with it."""
        self._channel = self._queue = self._tag = None
        self._attached_to = None

    def _on_cancel(self, frame: Basic.Cancel) -> None:
        if self._stopped or frame.consumer_tag != self._tag:
            return
        LOG.warning(
            "RabbitMQ cancelled the consumer of %s (its queue moved or was deleted); "
            "consuming it again",
            self._name,
        )
        self._attached_to = None
        task = asyncio.get_running_loop().create_task(self._attach_again())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attach_again(self) -> None:
        """Attach on the current connection after a cancel, with backoff; a new
        connection attaches every consumer itself."""
        failures = 0
        while not self._stopped:
            connection = self._transport.broker.connection if self._transport.broker else None
            if connection is None or self._attached_to is not None:
                return
            try:
                await self.attach(connection)
                LOG.info("consuming %s again", self._name)
                return
            except (MessagingError, *CHANNEL_ERRORS) as exc:
                failures += 1
                pause = backoff(failures)
                LOG.warning(
                    "could not consume %s again (%s); retrying in %.1fs", self._name, exc, pause
                )
                await asyncio.sleep(pause)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if self._stopped:
            # Left unacknowledged: closing the channel returns it to the queue.
            return
        task = asyncio.get_running_loop().create_task(self._process(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, message: AbstractIncomingMessage) -> None:
        incoming = _incoming(message)
        try:
            settlement = await self._handler(incoming)
        except Exception as exc:
            LOG.exception(
                "handler for %s failed on message %s; dead-lettering it",
                self._name,
                message.message_id,
            )
            settlement = Settlement(Settle.DEAD_LETTER, None, f"{type(exc).__name__}: {exc}")
        await self._transport.send_reply(message, settlement.reply)
        await self._settle(message, incoming, settlement)

    async def _settle(
        self, message: AbstractIncomingMessage, incoming: IncomingMessage, settlement: Settlement
    ) -> None:
        try:
            if settlement.settle is Settle.ACK:
                await message.ack()
            elif settlement.settle is Settle.REQUEUE:
                await message.nack(requeue=True)
            elif await self._transport.dead_letter(self._topic, incoming, settlement.reason):
                await message.ack()
            else:
                await message.reject(requeue=False)
        except CHANNEL_ERRORS as exc:
            LOG.warning(
                "could not settle message %s on %s (%s; the broker will deliver it again): %r",
                message.message_id,
                self._name,
                settlement.settle.value,
                exc,
            )

    async def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            try:
                await channel.close()
            except CHANNEL_ERRORS as exc:
                LOG.warning("could not close the channel of %s: %s", self._name, exc)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._tag is not None and self._queue is not None:
            try:
                await self._queue.cancel(self._tag)
            except CHANNEL_ERRORS as exc:
                LOG.warning("could not cancel the consumer of %s: %s", self._name, exc)
        if self._tasks:
            LOG.info(
                "draining %d in-flight message(s) on %s (up to %gs)",
                len(self._tasks),
                self._name,
                drain_timeout,
            )
            _, pending = await asyncio.wait(set(self._tasks), timeout=drain_timeout)
            if pending:
                LOG.warning(
                    "%d message(s) on %s still in flight after %gs; returning them to the queue",
                    len(pending),
                    self._name,
                    drain_timeout,
                )
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        await self._close_channel()
        self.detach()
        self._transport.forget(self)
        LOG.info("stopped consuming %s", self._name)
