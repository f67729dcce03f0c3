"""keel's layout on RabbitMQ: exchanges, queues, routing keys and dead letters.

For an exchange named ``E``:

* ``E``: a durable topic exchange. A cast to ``topic`` is published with routing key
  ``cast.<topic>``, a call with ``call.<topic>``; both reach the topic's queue.
* ``E.<topic>``: the queue a topic's servers consume (``conductor``, ``scheduler``,
  ``compute.<service-uuid>``). It is a *quorum* queue (replicated in a cluster, its
  messages persisted), with a delivery limit: a message delivered more than
  ``delivery_limit`` times after the first without being settled — a handler that keeps
  crashing its process, say — is dead-lettered by RabbitMQ itself.
* ``E.dead``: the topic exchange dead letters go to, by their routing key:
  ``E.dead-letter.casts`` (``cast.#``) keeps every dead cast until an operator looks at
  it (``keel-manage dlq``): each is work that was not done. ``E.dead-letter.calls``
  (``call.#``) keeps the last ``DEAD_CALLS_KEPT`` calls that expired on a queue or were
  rejected: their callers already got a timeout or an error, so they are kept for
  inspection only.

A message keel dead-letters itself is published to ``E.dead`` with headers saying why
(``x-keel-reason``) and how often it was delivered (``x-keel-deliveries``); one that
RabbitMQ dead-letters (expired, delivery limit) carries RabbitMQ's ``x-death`` headers.

A topic queue left as a classic queue by an older keel is replaced by a quorum queue when
it is empty and unused; otherwise the process refuses to start and says how to drain it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
    ExchangeType,
)
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from shared.exceptions import MessagingError
from shared.rpc.transport import DeadLetter

LOG = logging.getLogger(__name__)

#: Dead calls kept for inspection; older ones make room (their callers already know).
DEAD_CALLS_KEPT = 1000

CAST, CALL = "cast", "call"
REASON_HEADER = "x-keel-reason"
DELIVERIES_HEADER = "x-keel-deliveries"
TOPIC_HEADER = "x-keel-topic"


def routing_key(kind: str, topic: str) -> str:
    return f"{kind}.{topic}"


def delivery_count(message: AbstractIncomingMessage) -> int:
    """Earlier deliveries of ``message``, as a quorum queue counts them."""
    value = (message.headers or {}).get("x-delivery-count", 0)
    return value if isinstance(value, int) and value >= 0 else 0


class TopologyMissing(MessagingError):
    """The exchanges are not there, and this user may not declare them."""


class Topology:
    def __init__(
        self, exchange: str, *, delivery_limit: int = 5, queue_expires: float | None = None
    ) -> None:
        self.exchange = exchange
        self.dead_exchange = f"{exchange}.dead"
        self.dead_casts = f"{exchange}.dead-letter.casts"
        self.dead_calls = f"{exchange}.dead-letter.calls"
        self.delivery_limit = delivery_limit
        self.queue_expires = queue_expires

    def queue_name(self, topic: str) -> str:
        return f"{self.exchange}.{topic}"

    def _expires(self) -> dict[str, Any]:
        if self.queue_expires is None:
            return {}
        return {"x-expires": int(self.queue_expires * 1000)}

    def topic_queue_arguments(self) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_exchange,
            **self._expires(),
        }

    async def declare_exchanges(
        self, channel: AbstractChannel, *, passive: bool = False
    ) -> tuple[AbstractExchange, AbstractExchange]:
        """The topic exchange and the dead-letter exchange with its two queues.

        ``passive`` only checks that both exchanges exist: for an agent connecting as its
        own broker user, which may declare nothing shared (:mod:`shared.rpc.agent_users`).
        """
        if passive:
            try:
                exchange = await channel.declare_exchange(self.exchange, passive=True)
                dead = await channel.declare_exchange(self.dead_exchange, passive=True)
            except ChannelNotFoundEntity:
                raise TopologyMissing(
                    f"exchange {self.exchange} or {self.dead_exchange} does not exist on the "
                    "broker, and this agent's broker user may not declare it: start "
                    "keel-conductor first (it declares them)"
                ) from None
            return exchange, dead
        try:
            exchange = await channel.declare_exchange(
                self.exchange, ExchangeType.TOPIC, durable=True
            )
            dead = await channel.declare_exchange(
                self.dead_exchange, ExchangeType.TOPIC, durable=True
            )
            casts = await channel.declare_queue(
                self.dead_casts,
                durable=True,
                arguments={"x-queue-type": "quorum", **self._expires()},
            )
            await casts.bind(dead, routing_key=f"{CAST}.#")
            calls = await channel.declare_queue(
                self.dead_calls,
                durable=True,
                arguments={
                    "x-max-length": DEAD_CALLS_KEPT,
                    "x-overflow": "drop-head",
                    **self._expires(),
                },
            )
            await calls.bind(dead, routing_key=f"{CALL}.#")
        except ChannelPreconditionFailed as exc:
            raise MessagingError(
                f"exchange {self.exchange} or its dead-letter queues exist on the broker with "
                f"other settings: {exc}; delete them or choose another KEEL_EXCHANGE"
            ) from None
        return exchange, dead

    async def ensure_topic_queue(self, connection: AbstractRobustConnection, topic: str) -> None:
        """Make sure ``topic``'s quorum queue exists, replacing an empty classic one."""
        name = self.queue_name(topic)
        try:
            await self._declare_on_own_channel(connection, name)
            return
        except ChannelPreconditionFailed as exc:
            conflict = str(exc)
        channel = await connection.channel()
        try:
            existing = await channel.declare_queue(name, passive=True)
            info = existing.declaration_result
            if info.message_count or info.consumer_count:
                raise MessagingError(
                    f"queue {name} exists on the broker with other settings ({conflict}), "
                    f"holding {info.message_count} message(s) with {info.consumer_count} "
                    "consumer(s): it was declared by an older keel. Stop the processes "
                    f"consuming it, let it drain or move its messages, delete it (rabbitmqctl "
                    f"delete_queue {name}), then start this process again"
                )
            await existing.delete(if_unused=True, if_empty=True)
            LOG.warning(
                "replaced the empty queue %s, left with other settings by an older keel, "
                "by a quorum queue",
                name,
            )
        finally:
            if not channel.is_closed:
                await channel.close()
        await self._declare_on_own_channel(connection, name)

    async def _declare_on_own_channel(
        self, connection: AbstractRobustConnection, name: str
    ) -> None:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, durable=True, arguments=self.topic_queue_arguments())
        finally:
            if not channel.is_closed:
                await channel.close()

    async def bind_topic_queue(self, channel: AbstractChannel, topic: str) -> AbstractQueue:
        """Declare (it exists by now) and bind ``topic``'s queue on ``channel``."""
        queue = await channel.declare_queue(
            self.queue_name(topic), durable=True, arguments=self.topic_queue_arguments()
        )
        for kind in (CAST, CALL):
            await queue.bind(self.exchange, routing_key=routing_key(kind, topic))
        return queue

    async def delete(self, channel: AbstractChannel, topics: Sequence[str] = ()) -> None:
        """Remove the exchanges, the dead-letter queues and ``topics``' queues (idempotent).

        For tests and benchmarks that declared a throw-away exchange; reply queues go by
        themselves with their connections.
        """
        for queue in (self.dead_casts, self.dead_calls, *map(self.queue_name, topics)):
            await channel.queue_delete(queue)
        for exchange in (self.exchange, self.dead_exchange):
            await channel.exchange_delete(exchange)

    async def browse(
        self, connection: AbstractRobustConnection, *, calls: bool, limit: int
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first, returned to their queue afterwards."""
        channel = await connection.channel()
        found: list[DeadLetter] = []
        try:
            queue = await channel.declare_queue(
                self.dead_calls if calls else self.dead_casts, passive=True
            )
            while len(found) < limit:
                message = await queue.get(fail=False)
                if message is None:
                    break
                found.append(dead_letter(message))
        except ChannelNotFoundEntity:
            return []
        finally:
            # Closing the channel returns every message taken above to the queue.
            if not channel.is_closed:
                await channel.close()
        return found

    async def purge(self, connection: AbstractRobustConnection, *, calls: bool) -> int:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(
                self.dead_calls if calls else self.dead_casts, passive=True
            )
            result = await queue.purge()
        except ChannelNotFoundEntity:
            return 0
        finally:
            if not channel.is_closed:
                await channel.close()
        return int(getattr(result, "message_count", 0) or 0)


_BROKER_REASONS = {
    "delivery_limit": "delivered more often than the delivery limit without being settled "
    "(its handler kept crashing or losing its connection)",
    "expired": "nobody took it off its queue before its caller stopped waiting",
    "maxlen": "its queue was full",
}


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def dead_letter(message: AbstractIncomingMessage) -> DeadLetter:
    """What an operator needs to know about a message on a dead-letter queue."""
    headers = message.headers or {}
    key = message.routing_key or ""
    kind, _, topic = key.partition(".")
    deaths = headers.get("x-death")
    first = deaths[0] if isinstance(deaths, list) and deaths else {}
    first = first if isinstance(first, dict) else {}
    if REASON_HEADER in headers:
        reason, detail = "rejected", _text(headers[REASON_HEADER])
        deliveries = headers.get(DELIVERIES_HEADER, 1)
        topic = _text(headers.get(TOPIC_HEADER)) or topic
    else:
        reason = _text(headers.get("x-first-death-reason") or first.get("reason"))
        detail = _BROKER_REASONS.get(reason, "")
        deliveries = headers.get("x-delivery-count", 0)
        deliveries = (deliveries if isinstance(deliveries, int) else 0) + 1
    return DeadLetter(
        body=message.body,
        topic=topic,
        kind=kind if kind in (CAST, CALL) else CAST,
        reason=reason or "unknown",
        detail=detail,
        delivery_count=deliveries if isinstance(deliveries, int) else 1,
        message_id=message.message_id,
    )
