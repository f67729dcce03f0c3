"""The RabbitMQ transport: keel's RPC over one topic exchange, with aio-pika.

The exchanges and queues are laid out as :mod:`shared.rpc.amqp_topology` describes:
quorum queues per topic with a delivery limit, casts and calls told apart by their
routing keys, and dead letters kept by kind. Each transport also has one exclusive reply
queue ``E.reply.<uuid>``, where answers to its calls arrive, matched to the waiting
caller by correlation id.

Calls and casts are published ``mandatory`` on a channel with publisher confirms, so a
topic nobody serves fails at once with :class:`~shared.exceptions.Unroutable` instead
of after the call timeout, and a cast has been taken by the broker (persisted, and
replicated to a quorum of the queue's nodes) when ``cast`` returns.

The connection goes to any node of the cluster ``KEEL_TRANSPORT_URL`` lists and is
opened again, to the next node, when it drops (:mod:`shared.rpc.amqp_connection`).
Each reconnection declares the exchanges and a new reply queue and attaches every
consumer again; a consumer the broker cancels (its queue moved or was deleted) attaches
again by itself. A message published but not yet confirmed when the connection dropped
is published again once it is back (receivers are idempotent). A call already sent whose
reply queue went with the connection fails at once with
:class:`~shared.exceptions.ReplyQueueLost`; messages being handled when it dropped are
delivered again by the broker.

Each consumed message is settled as its handler's :class:`~shared.rpc.transport.Settlement`
says: acknowledged, returned to the queue, or dead-lettered — published to the
dead-letter exchange with the reason, then acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    DeliveryMode,
)
from aiormq.exceptions import (
    DeliveryError,
    PublishError,
)

from shared.config import Settings
from shared.exceptions import MessagingError, MessagingTimeout, ReplyQueueLost, Unroutable
from shared.rpc import agent_users
from shared.rpc.amqp_connection import BrokerConnection, backoff
from shared.rpc.amqp_consumer import CHANNEL_ERRORS as _CHANNEL_ERRORS
from shared.rpc.amqp_consumer import TopicConsumer
from shared.rpc.amqp_topology import (
    CALL,
    CAST,
    DELIVERIES_HEADER,
    REASON_HEADER,
    TOPIC_HEADER,
    Topology,
    TopologyMissing,
    routing_key,
)
from shared.rpc.broker_url import user_of, without_credentials
from shared.rpc.envelope import CONTENT_TYPE
from shared.rpc.transport import (
    Consumer,
    DeadLetter,
    Handler,
    IncomingMessage,
    Transport,
)

LOG = logging.getLogger(__name__)

#: Seconds between a publish the broker did not confirm and sending it again.
RESEND_PAUSE = 0.05


#: Seconds a publish RabbitMQ keeps refusing (nack) is sent again before giving up.
REFUSED_FOR = 10.0


class _NotConfirmed(Exception):
    """The connection or channel went away before the broker confirmed a publish."""


class _Refused(Exception):
    """RabbitMQ refused a publish (a nack): its queue could not take it."""


@dataclass(frozen=True)
class _Publisher:
    """A channel with publisher confirms, and the two exchanges on it."""

    channel: AbstractChannel
    exchange: AbstractExchange
    dead: AbstractExchange

    @classmethod
    async def open(cls, connection: AbstractConnection, topology: Topology) -> _Publisher:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        return cls(
            channel,
            await channel.get_exchange(topology.exchange, ensure=False),
            await channel.get_exchange(topology.dead_exchange, ensure=False),
        )


class AmqpTransport(Transport):
    """:class:`~shared.rpc.transport.Transport` on RabbitMQ; see the module docstring."""

    def __init__(
        self,
        url: str,
        exchange: str,
        *,
        queue_expires: float | None = None,
        connect_timeout: float = 60.0,
        delivery_limit: int = 5,
        quorum_group_size: int = 3,
        heartbeat: int = 10,
    ) -> None:
        self.url = url
        #: AMQP heartbeat seconds, unless the URL sets them (0: the broker's).
        self.heartbeat = heartbeat
        #: The broker user this transport connects as. Every message it publishes says so
        #: in its AMQP ``user_id``, which RabbitMQ checks against the connection's user:
        #: a message claiming to come from another user is refused by the broker.
        self.user = user_of(url)
        #: An agent connecting as its own user may not declare the shared topology
        #: (:mod:`shared.rpc.agent_users`); it only checks that the exchanges exist.
        self.declares_topology = agent_users.service_of(self.user) is None
        self.exchange = exchange
        self.queue_expires = queue_expires
        self.connect_timeout = connect_timeout
        self.topology = Topology(
            exchange,
            delivery_limit=delivery_limit,
            queue_expires=queue_expires,
            quorum_group_size=quorum_group_size,
        )
        self.reply_queue = f"{exchange}.reply.{uuid.uuid4()}"
        #: The connection to the cluster, from :meth:`connect` to :meth:`close`.
        self.broker: BrokerConnection | None = None
        self._publisher: _Publisher | None = None
        self._reopening = asyncio.Lock()
        self._lost_listeners: list[Callable[[str], None]] = []
        #: Replies go out on a channel without publisher confirms: waiting for the
        #: broker's confirm of each reply held the request (and its prefetch slot) for a
        #: round trip; a reply that is lost makes its caller time out, as it would anyway.
        #: The reply queue is consumed on it too.
        self._reply_channel: AbstractChannel | None = None
        self._waiting: dict[str, asyncio.Future[bytes]] = {}
        self._consumers: set[TopicConsumer] = set()

    @classmethod
    def from_settings(cls, settings: Settings) -> AmqpTransport:
        """The transport a keel process uses, as its settings describe it."""
        return cls(
            settings.transport_url,
            settings.exchange,
            queue_expires=settings.rpc.queue_expires,
            connect_timeout=settings.rpc.connect_timeout,
            delivery_limit=settings.rpc.delivery_limit,
            quorum_group_size=settings.rpc.quorum_group_size,
            heartbeat=settings.rpc.heartbeat,
        )

    @property
    def node(self) -> str | None:
        """``host:port`` of the RabbitMQ node this transport is connected to now."""
        return self.broker.node if self.broker and self.broker.connection else None

    async def connect(self) -> None:
        if self.broker is not None:
            return
        broker = BrokerConnection(
            self.url,
            connect_timeout=self.connect_timeout,
            on_connect=self._on_connect,
            on_lost=self._on_lost,
            # An agent on its own broker user started before keel-conductor ever did:
            # wait for the exchanges (bounded), as for the broker itself.
            retry_first=(TopologyMissing,),
            heartbeat=self.heartbeat,
        )
        await broker.open()
        self.broker = broker
        LOG.info("connected to RabbitMQ at %s, exchange %s", broker.where, self.exchange)

    async def _on_connect(self, connection: AbstractConnection) -> None:
        """Declare what this transport needs on a new connection and consume again."""
        publisher = await _Publisher.open(connection, self.topology)
        await self.topology.declare_exchanges(publisher.channel, passive=not self.declares_topology)
        if self.declares_topology:
            await self.topology.declare_dead_letter_queues(connection)
        replies = await connection.channel(publisher_confirms=False)
        queue = await replies.declare_queue(self.reply_queue, exclusive=True, auto_delete=True)
        await queue.consume(self._on_reply, no_ack=True)
        replies.close_callbacks.add(self._on_reply_channel_closed)
        for consumer in list(self._consumers):
            await consumer.attach(connection)
        self._publisher, self._reply_channel = publisher, replies

    def _on_lost(self, reason: str) -> None:
        self._publisher = None
        self._reply_channel = None
        for consumer in self._consumers:
            consumer.detach()
        self._fail_waiting(ReplyQueueLost(f"{reason}; the reply queue went with it"))
        for listener in self._lost_listeners:
            try:
                listener(reason)
            except Exception:
                LOG.exception("a listener to the loss of the broker connection failed")

    def on_connection_lost(self, listener: Callable[[str], None]) -> None:
        self._lost_listeners.append(listener)

    def _on_reply_channel_closed(self, sender: object, exc: BaseException | None = None) -> None:
        if sender is self._reply_channel:
            self._fail_waiting(
                ReplyQueueLost(f"the channel of the reply queue closed: {exc or 'closed'}")
            )

    def _fail_waiting(self, error: MessagingError) -> None:
        waiting = [f for f in self._waiting.values() if not f.done()]
        if waiting:
            LOG.warning(
                "failing %d call(s) still waiting for a reply: %s", len(waiting), error.message
            )
        for future in waiting:
            future.set_exception(error)

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        future = self._waiting.get(message.correlation_id or "")
        if future is None or future.done():
            LOG.debug("discarding reply %s: nobody waits for it any more", message.correlation_id)
            return
        future.set_result(message.body)

    async def _ready(self) -> _Publisher:
        """The publishing channel, once the connection is back if it was lost."""
        if self.broker is None:
            raise MessagingError("the RabbitMQ transport is not connected")
        connection = await self.broker.ready(self.connect_timeout)
        publisher = self._publisher
        if publisher is not None and not publisher.channel.is_closed:
            return publisher
        async with self._reopening:
            # Closed by a channel-level error while the connection lives: open another.
            publisher = self._publisher
            if publisher is None or publisher.channel.is_closed:
                try:
                    publisher = await _Publisher.open(connection, self.topology)
                except (*_CHANNEL_ERRORS, RuntimeError) as exc:
                    # RuntimeError: the connection closed and has not said so yet.
                    raise _NotConfirmed(str(exc)) from None
                self._publisher = publisher
            return publisher

    async def _publish_once(self, kind: str, topic: str, message: aio_pika.Message) -> None:
        publisher = await self._ready()
        try:
            await publisher.exchange.publish(
                message, routing_key=routing_key(kind, topic), mandatory=True
            )
        except PublishError:
            raise Unroutable(
                f"no queue is bound for topic {topic!r} on exchange {self.exchange}: "
                "is the service for that topic running?"
            ) from None
        except DeliveryError as exc:
            # A quorum queue without a leader refuses; and a channel opened while its
            # leader was being elected may go on refusing after there is one, when a
            # new channel gets through. So: the next attempt is on a new channel.
            await self._drop_publisher(publisher)
            raise _Refused(str(exc)) from None
        except _CHANNEL_ERRORS as exc:
            raise _NotConfirmed(str(exc) or type(exc).__name__) from None
        except asyncio.CancelledError:
            # A channel that closes cancels the confirmations it still owes: that is a
            # lost connection, not a cancellation of this task (which would leave, say,
            # a heartbeat loop dead for good).
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise _NotConfirmed("the channel closed before RabbitMQ confirmed it") from None

    async def _drop_publisher(self, publisher: _Publisher) -> None:
        if self._publisher is publisher:
            self._publisher = None
        if not publisher.channel.is_closed:
            try:
                await publisher.channel.close()
            except _CHANNEL_ERRORS as exc:
                LOG.debug("closing a publishing channel: %r", exc)

    async def _publish(
        self,
        kind: str,
        topic: str,
        message: aio_pika.Message,
        before_each: Callable[[], None] | None = None,
    ) -> None:
        """Publish until RabbitMQ confirms: again, on the new connection, when the old one
        went away first; again, on a new channel, when it refused (for ``REFUSED_FOR``
        seconds at most). The caller bounds the whole. ``before_each`` runs before each
        attempt."""
        refused_since: float | None = None
        refusals = 0
        while True:
            if before_each is not None:
                before_each()
            try:
                await self._publish_once(kind, topic, message)
                return
            except _NotConfirmed as lost:
                await self._resending(kind, topic, message, str(lost))
            except _Refused as refused:
                now = time.monotonic()
                refused_since = refused_since or now
                if now - refused_since >= REFUSED_FOR:
                    raise MessagingError(
                        f"RabbitMQ refused a message for {topic!r} for {REFUSED_FOR:g}s: {refused}"
                    ) from None
                refusals += 1
                pause = backoff(refusals)
                LOG.warning(
                    "RabbitMQ refused %s %s to %s (%s); sending it again on a new channel in %.1fs",
                    kind,
                    message.message_id,
                    topic,
                    refused,
                    pause,
                )
                await asyncio.sleep(pause)

    async def _resending(self, kind: str, topic: str, message: aio_pika.Message, why: str) -> None:
        """Log that ``message`` goes out again, after a pause for the loss to be seen."""
        LOG.warning(
            "%s %s to %s not confirmed by RabbitMQ before its connection went away (%s); "
            "sending it again",
            kind,
            message.message_id,
            topic,
            why,
        )
        await asyncio.sleep(RESEND_PAUSE)

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        correlation_id = str(uuid.uuid4())
        message = aio_pika.Message(
            body,
            content_type=CONTENT_TYPE,
            correlation_id=correlation_id,
            reply_to=self.reply_queue,
            message_id=message_id,
            expiration=timeout,
            delivery_mode=DeliveryMode.NOT_PERSISTENT,
            user_id=self.user,
        )
        loop = asyncio.get_running_loop()

        def wait_for_reply() -> None:
            # An attempt after the connection was lost goes out with a new reply queue:
            # the failure of the old one is not its answer.
            waiting = self._waiting.get(correlation_id)
            if waiting is not None and waiting.done() and not waiting.cancelled():
                waiting.exception()  # seen: it is not this call's outcome
            if waiting is None or waiting.done():
                self._waiting[correlation_id] = loop.create_future()

        try:
            async with asyncio.timeout(timeout):
                await self._publish(CALL, topic, message, wait_for_reply)
                return await self._waiting[correlation_id]
        except TimeoutError:
            raise MessagingTimeout(f"no reply from {topic} within {timeout:g}s") from None
        finally:
            self._waiting.pop(correlation_id, None)

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        message = aio_pika.Message(
            body,
            content_type=CONTENT_TYPE,
            message_id=message_id,
            delivery_mode=DeliveryMode.PERSISTENT,
            user_id=self.user,
        )
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._publish(CAST, topic, message)
        except TimeoutError:
            raise MessagingError(
                f"RabbitMQ at {without_credentials(self.url)} did not take a cast to {topic} "
                f"within {self.connect_timeout:g}s"
            ) from None

    async def dead_letter(self, topic: str, message: IncomingMessage, reason: str) -> bool:
        """Publish a copy of ``message`` to the dead-letter exchange with ``reason``.

        False if that failed; the caller then rejects the message so RabbitMQ
        dead-letters it (without keel's reason) instead.
        """
        kind = CALL if message.is_call else CAST
        copy = aio_pika.Message(
            message.body,
            content_type=CONTENT_TYPE,
            message_id=message.message_id,
            delivery_mode=DeliveryMode.PERSISTENT,
            user_id=self.user,
            headers={
                REASON_HEADER: reason[:2000],
                DELIVERIES_HEADER: message.delivery_count + 1,
                TOPIC_HEADER: topic,
            },
        )
        try:
            publisher = await self._ready()
            await publisher.dead.publish(copy, routing_key=routing_key(kind, topic))
        except (MessagingError, _NotConfirmed, *_CHANNEL_ERRORS) as exc:
            LOG.warning(
                "could not dead-letter message %s with its reason: %r", message.message_id, exc
            )
            return False
        LOG.info(
            "dead-lettered %s message %s from %s: %s",
            kind,
            message.message_id,
            topic,
            reason,
            extra={"decision": "dead_lettered"},
        )
        return True

    async def send_reply(self, request: AbstractIncomingMessage, body: bytes | None) -> None:
        """Answer ``request`` on its reply queue, if it has one and there is an answer."""
        if body is None or not request.reply_to:
            return
        reply = aio_pika.Message(
            body,
            content_type=CONTENT_TYPE,
            correlation_id=request.correlation_id,
            user_id=self.user,
        )
        channel = self._reply_channel
        if channel is None or channel.is_closed:
            LOG.warning(
                "cannot reply to message %s: no connection to RabbitMQ (its caller will "
                "time out or has lost its reply queue)",
                request.message_id,
            )
            return
        try:
            await channel.default_exchange.publish(
                reply, routing_key=request.reply_to, mandatory=False
            )
        except _CHANNEL_ERRORS as exc:
            LOG.warning(
                "could not send the reply to message %s (its caller will time out): %s",
                request.message_id,
                exc,
            )

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        if self.broker is None:
            raise MessagingError("the RabbitMQ transport is not connected")
        consumer = TopicConsumer(self, topic, handler, prefetch)
        # Known before it attaches, so a reconnection meanwhile attaches it too.
        self._consumers.add(consumer)
        try:
            async with asyncio.timeout(self.connect_timeout):
                while True:
                    connection = await self.broker.ready(self.connect_timeout)
                    try:
                        await consumer.attach(connection)
                        break
                    except _CHANNEL_ERRORS as exc:
                        if self.broker.connection is connection:
                            raise MessagingError(f"cannot consume {topic}: {exc}") from None
                        LOG.warning("connection lost while starting to consume %s", topic)
        except BaseException as exc:
            await consumer.stop(0)
            if isinstance(exc, TimeoutError):
                raise MessagingError(
                    f"cannot consume {topic} within {self.connect_timeout:g}s"
                ) from None
            raise
        LOG.info("consuming %s (prefetch %d)", self.topology.queue_name(topic), prefetch)
        return consumer

    def forget(self, consumer: TopicConsumer) -> None:
        """Called by a consumer once it has stopped."""
        self._consumers.discard(consumer)

    async def _connection(self) -> AbstractConnection:
        if self.broker is None:
            raise MessagingError("the RabbitMQ transport is not connected")
        return await self.broker.ready(self.connect_timeout)

    async def is_consumed(self, topic: str) -> bool | None:
        """Asked of the broker with a passive declaration of the topic's queue: no queue,
        or a queue without a consumer, is False; a broker that cannot say is ``None``."""
        try:
            connection = await self._connection()
            async with asyncio.timeout(self.connect_timeout):
                return await self.topology.is_consumed(connection, topic)
        except (TimeoutError, MessagingError, *_CHANNEL_ERRORS) as exc:
            LOG.debug("could not tell whether %s has a consumer: %r", topic, exc)
            return None

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        connection = await self._connection()
        return await self.topology.browse(connection, calls=calls, limit=limit)

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        connection = await self._connection()
        return await self.topology.purge(connection, calls=calls)

    async def close(self) -> None:
        for consumer in list(self._consumers):
            await consumer.stop(0)
        self._fail_waiting(MessagingError("transport closed"))
        broker, self.broker = self.broker, None
        self._publisher = None
        self._reply_channel = None
        if broker is not None:
            await broker.close()
            LOG.info("disconnected from RabbitMQ at %s", broker.where)
