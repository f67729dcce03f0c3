"""The RabbitMQ transport: keel's RPC over one topic exchange, with aio-pika.

The exchanges and queues are laid out as :mod:`shared.rpc.amqp_topology` describes:
quorum queues per topic with a delivery limit, casts and calls told apart by their
routing keys, and dead letters kept by kind. Each transport also has one exclusive reply
queue ``E.reply.<uuid>``, where answers to its calls arrive, matched to the waiting
caller by correlation id.

Calls and casts are published ``mandatory`` on a channel with publisher confirms, so a
topic nobody serves fails at once with :class:`~shared.exceptions.Unroutable` instead
of after the call timeout, and a cast has been taken by the broker (persisted) when
``cast`` returns. The connection is robust: after a broker restart or a network cut it
reconnects and re-declares queues, bindings and consumers by itself; calls that were
waiting when the connection dropped fail with a ``MessagingError``, and messages being
handled when it dropped are delivered again (handlers are idempotent).

Each consumed message is settled as its handler's :class:`~shared.rpc.transport.Settlement`
says: acknowledged, returned to the queue, or dead-lettered — published to the
dead-letter exchange with the reason, then acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
    DeliveryMode,
)
from aiormq.exceptions import (
    AMQPConnectionError,
    AMQPError,
    AuthenticationError,
    ChannelInvalidStateError,
    DeliveryError,
    ProbableAuthenticationError,
    PublishError,
)
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)
from yarl import URL

from shared.config import Settings
from shared.exceptions import MessagingError, MessagingTimeout, Unroutable
from shared.rpc import agent_users
from shared.rpc.amqp_topology import (
    CALL,
    CAST,
    DELIVERIES_HEADER,
    REASON_HEADER,
    TOPIC_HEADER,
    Topology,
    TopologyMissing,
    delivery_count,
    routing_key,
)
from shared.rpc.envelope import CONTENT_TYPE
from shared.rpc.transport import (
    Consumer,
    DeadLetter,
    Handler,
    IncomingMessage,
    Settle,
    Settlement,
    Transport,
)

LOG = logging.getLogger(__name__)

#: Broker-side failures of an operation on a channel or connection that is going away.
_CHANNEL_ERRORS = (AMQPError, ChannelInvalidStateError, OSError)
#: Seconds one connection attempt may take before it counts as failed.
_ATTEMPT_TIMEOUT = 10.0


def _is_transient(exc: BaseException) -> bool:
    """A connection failure worth retrying: not a refusal of our credentials."""
    if isinstance(exc, AuthenticationError | ProbableAuthenticationError):
        return False
    return isinstance(exc, AMQPConnectionError | OSError)


def _where(url: str) -> str:
    """The broker address without credentials, for logs and errors."""
    return str(URL(url).with_user(None))


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


class _AmqpConsumer(Consumer):
    """One topic queue consumed on its own channel; each message in its own task."""

    def __init__(
        self, transport: AmqpTransport, channel: AbstractChannel, queue: AbstractQueue, topic: str
    ) -> None:
        self._transport = transport
        self._channel = channel
        self._queue = queue
        self._topic = topic
        self._handler: Handler | None = None
        self._tag: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    async def start(self, handler: Handler) -> None:
        self._handler = handler
        self._tag = await self._queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if self._stopped:
            # Left unacknowledged: closing the channel returns it to the queue.
            return
        task = asyncio.get_running_loop().create_task(self._process(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, message: AbstractIncomingMessage) -> None:
        assert self._handler is not None
        incoming = _incoming(message)
        try:
            settlement = await self._handler(incoming)
        except Exception as exc:
            LOG.exception(
                "handler for %s failed on message %s; dead-lettering it",
                self._queue.name,
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
        except _CHANNEL_ERRORS as exc:
            LOG.warning(
                "could not settle message %s on %s (%s; the broker will deliver it again): %r",
                message.message_id,
                self._queue.name,
                settlement.settle.value,
                exc,
            )

    async def stop(self, drain_timeout: float = 30.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._tag is not None:
            try:
                await self._queue.cancel(self._tag)
            except _CHANNEL_ERRORS as exc:
                LOG.warning("could not cancel the consumer of %s: %s", self._queue.name, exc)
        if self._tasks:
            LOG.info(
                "draining %d in-flight message(s) on %s (up to %gs)",
                len(self._tasks),
                self._queue.name,
                drain_timeout,
            )
            _, pending = await asyncio.wait(set(self._tasks), timeout=drain_timeout)
            if pending:
                LOG.warning(
                    "%d message(s) on %s still in flight after %gs; returning them to the queue",
                    len(pending),
                    self._queue.name,
                    drain_timeout,
                )
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        try:
            await self._channel.close()
        except _CHANNEL_ERRORS as exc:
            LOG.warning("could not close the channel of %s: %s", self._queue.name, exc)
        self._transport.forget(self)
        LOG.info("stopped consuming %s", self._queue.name)


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
    ) -> None:
        self.url = url
        #: The broker user this transport connects as. Every message it publishes says so
        #: in its AMQP ``user_id``, which RabbitMQ checks against the connection's user:
        #: a message claiming to come from another user is refused by the broker.
        self.user = URL(url).user or "guest"
        #: An agent connecting as its own user may not declare the shared topology
        #: (:mod:`shared.rpc.agent_users`); it only checks that the exchanges exist.
        self.declares_topology = agent_users.service_of(self.user) is None
        self.exchange = exchange
        self.queue_expires = queue_expires
        self.connect_timeout = connect_timeout
        self.topology = Topology(
            exchange, delivery_limit=delivery_limit, queue_expires=queue_expires
        )
        self.reply_queue = f"{exchange}.reply.{uuid.uuid4()}"
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        #: Replies go out on a channel without publisher confirms: waiting for the
        #: broker's confirm of each reply held the request (and its prefetch slot) for a
        #: round trip; a reply that is lost makes its caller time out, as it would anyway.
        self._reply_channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._dead_exchange: AbstractExchange | None = None
        self._waiting: dict[str, asyncio.Future[bytes]] = {}
        self._consumers: set[_AmqpConsumer] = set()

    @classmethod
    def from_settings(cls, settings: Settings) -> AmqpTransport:
        """The transport a keel process uses, as its settings describe it."""
        return cls(
            settings.transport_url,
            settings.exchange,
            queue_expires=settings.rpc.queue_expires,
            connect_timeout=settings.rpc.connect_timeout,
            delivery_limit=settings.rpc.delivery_limit,
        )

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        elapsed = state.seconds_since_start or 0.0
        LOG.warning(
            "RabbitMQ at %s not reachable (attempt %d): %s; retrying in %.1fs, giving up in %.0fs",
            _where(self.url),
            state.attempt_number,
            error,
            state.upcoming_sleep,
            max(self.connect_timeout - elapsed, 0.0),
        )

    async def _open_connection(self) -> AbstractRobustConnection:
        """Connect, retrying transient failures for ``connect_timeout`` seconds."""
        where = _where(self.url)
        jitter = wait_random_exponential(multiplier=0.5, max=5)

        def backoff(state: RetryCallState) -> float:
            remaining = self.connect_timeout - (state.seconds_since_start or 0.0)
            return max(min(jitter(state), remaining), 0.0)

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_is_transient),
                stop=stop_after_delay(self.connect_timeout),
                wait=backoff,
                before_sleep=self._log_retry,
                reraise=True,
            ):
                with attempt:
                    return await aio_pika.connect_robust(
                        self.url, timeout=min(_ATTEMPT_TIMEOUT, self.connect_timeout)
                    )
        except (AuthenticationError, ProbableAuthenticationError) as exc:
            raise MessagingError(
                f"RabbitMQ at {where} refused the connection: {exc}; "
                "check the user, password and vhost in KEEL_TRANSPORT_URL"
            ) from None
        except (AMQPConnectionError, OSError) as exc:
            raise MessagingError(
                f"cannot connect to RabbitMQ at {where} within {self.connect_timeout:g}s: {exc}"
            ) from None
        raise AssertionError("unreachable: the retry loop returns or raises")

    async def connect(self) -> None:
        if self._connection is not None:
            return
        started = time.monotonic()
        while True:
            connection = await self._open_connection()
            try:
                await self._declare(connection)
                break
            except TopologyMissing as missing:
                await connection.close()
                # An agent on its own broker user started before keel-conductor ever
                # did: wait for the exchanges (bounded), as for the broker itself.
                left = self.connect_timeout - (time.monotonic() - started)
                if left <= 0:
                    raise
                LOG.warning("%s; retrying for another %.0fs", missing.message, left)
                await asyncio.sleep(min(2.0, left))
            except BaseException:
                await connection.close()
                raise
        self._connection = connection
        LOG.info("connected to RabbitMQ at %s, exchange %s", _where(self.url), self.exchange)

    async def _declare(self, connection: AbstractRobustConnection) -> None:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange, dead = await self.topology.declare_exchanges(
            channel, passive=not self.declares_topology
        )
        replies = await channel.declare_queue(self.reply_queue, exclusive=True, auto_delete=True)
        await replies.consume(self._on_reply, no_ack=True)
        channel.close_callbacks.add(self._on_channel_closed)
        self._reply_channel = await connection.channel(publisher_confirms=False)
        self._channel = channel
        self._exchange = exchange
        self._dead_exchange = dead

    def _on_channel_closed(self, _sender: object, exc: BaseException | None = None) -> None:
        reason = f"connection to RabbitMQ lost: {exc}" if exc else "channel to RabbitMQ closed"
        self._fail_waiting(reason)

    def _fail_waiting(self, reason: str) -> None:
        waiting = [f for f in self._waiting.values() if not f.done()]
        if waiting:
            LOG.warning("failing %d call(s) still waiting for a reply: %s", len(waiting), reason)
        for future in waiting:
            future.set_exception(MessagingError(reason))

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        future = self._waiting.get(message.correlation_id or "")
        if future is None or future.done():
            LOG.debug("discarding reply %s: nobody waits for it any more", message.correlation_id)
            return
        future.set_result(message.body)

    def _connected(self) -> AbstractExchange:
        if self._exchange is None:
            raise MessagingError("the RabbitMQ transport is not connected")
        return self._exchange

    async def _ready(self) -> AbstractExchange:
        """The exchange to publish on, once the connection is back if it was lost."""
        exchange = self._connected()
        if self._channel is not None and self._channel.is_closed:
            LOG.info("waiting for the connection to RabbitMQ to come back before publishing")
            try:
                async with asyncio.timeout(self.connect_timeout):
                    await self._channel.ready()
            except TimeoutError:
                raise MessagingError(
                    f"RabbitMQ at {_where(self.url)} unreachable for {self.connect_timeout:g}s"
                ) from None
        return exchange

    async def _publish(self, kind: str, topic: str, message: aio_pika.Message) -> None:
        exchange = await self._ready()
        try:
            await exchange.publish(message, routing_key=routing_key(kind, topic), mandatory=True)
        except PublishError:
            raise Unroutable(
                f"no queue is bound for topic {topic!r} on exchange {self.exchange}: "
                "is the service for that topic running?"
            ) from None
        except DeliveryError as exc:
            raise MessagingError(f"RabbitMQ refused a message for {topic!r}: {exc}") from None
        except _CHANNEL_ERRORS as exc:
            raise MessagingError(f"cannot publish to {topic!r}: {exc}") from None
        except asyncio.CancelledError:
            # A channel that closes cancels the confirmations it still owes: that is a
            # lost connection, not a cancellation of this task (which would leave, say,
            # a heartbeat loop dead for good).
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise MessagingError(
                f"cannot publish to {topic!r}: the channel closed before RabbitMQ confirmed it"
            ) from None

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        correlation_id = str(uuid.uuid4())
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
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
        try:
            async with asyncio.timeout(timeout):
                await self._publish(CALL, topic, message)
                return await future
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
        await self._publish(CAST, topic, message)

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
            await self._ready()
            assert self._dead_exchange is not None
            await self._dead_exchange.publish(copy, routing_key=routing_key(kind, topic))
        except (MessagingError, *_CHANNEL_ERRORS) as exc:
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
        if self._reply_channel is None:
            LOG.warning("cannot reply to message %s: transport closed", request.message_id)
            return
        try:
            await self._reply_channel.default_exchange.publish(
                reply, routing_key=request.reply_to, mandatory=False
            )
        except _CHANNEL_ERRORS as exc:
            LOG.warning(
                "could not send the reply to message %s (its caller will time out): %s",
                request.message_id,
                exc,
            )

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        if self._connection is None:
            raise MessagingError("the RabbitMQ transport is not connected")
        await self.topology.ensure_topic_queue(self._connection, topic)
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            await channel.set_qos(prefetch_count=prefetch)
            queue = await self.topology.bind_topic_queue(channel, topic)
            consumer = _AmqpConsumer(self, channel, queue, topic)
            await consumer.start(handler)
        except BaseException:
            if not channel.is_closed:
                await channel.close()
            raise
        self._consumers.add(consumer)
        LOG.info("consuming %s (prefetch %d)", queue.name, prefetch)
        return consumer

    def forget(self, consumer: _AmqpConsumer) -> None:
        """Called by a consumer once it has stopped."""
        self._consumers.discard(consumer)

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        self._connected()
        assert self._connection is not None
        return await self.topology.browse(self._connection, calls=calls, limit=limit)

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        self._connected()
        assert self._connection is not None
        return await self.topology.purge(self._connection, calls=calls)

    async def close(self) -> None:
        for consumer in list(self._consumers):
            await consumer.stop(0)
        self._fail_waiting("transport closed")
        connection, self._connection = self._connection, None
        self._channel = self._reply_channel = None
        self._exchange = self._dead_exchange = None
        if connection is not None:
            await connection.close()
            LOG.info("disconnected from RabbitMQ at %s", _where(self.url))
