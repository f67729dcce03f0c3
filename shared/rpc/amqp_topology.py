"""keel's layout on RabbitMQ: exchanges, queues, routing keys and dead letters.

For an exchange named ``E``:

* ``E``: a durable topic exchange. A cast to ``topic`` is published with routing key
  ``cast.<topic>``, a call with ``call.<topic>``; both reach the topic's queue.
* ``E.<topic>``: the queue a topic's servers consume (``conductor``, ``scheduler``,
  ``compute.<service-uuid>``). It is a *quorum* queue (replicated in a cluster, its
  messages persisted), with a delivery limit: a message delivered more than
  ``delivery_limit`` times after the first without being settled — a handler that keeps
  crashing its process, say — is dead-lettered by RabbitMQ itself. It is created with
  ``x-quorum-initial-group-size`` replicas (``KEEL_RPC__QUORUM_GROUP_SIZE``, 3 by
  default; RabbitMQ places ``min(size, cluster nodes)``), so it survives the loss of a
  minority of them. That size counts only when the queue is created: a queue that
  exists keeps its members (an operator adds one with ``rabbitmq-queues grow``).
* ``E.dead``: the topic exchange dead letters go to, by their routing key:
  ``E.dead-letter.casts`` (``cast.#``) keeps every dead cast until an operator looks at
  it (``keel-manage dlq``): each is work that was not done. ``E.dead-letter.calls``
  (``call.#``) keeps the last ``DEAD_CALLS_KEPT`` calls that expired on a queue or were
  rejected: their callers already got a timeout or an error, so they are kept for
  inspection only. Both are quorum queues too: a queue that lives on one node (a
  classic queue) could not be declared again while that node is down, and every
  process would fail to reconnect.

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
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
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
GROUP_SIZE_ARGUMENT = "x-quorum-initial-group-size"


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
        self,
        exchange: str,
        *,
        delivery_limit: int = 5,
        queue_expires: float | None = None,
        quorum_group_size: int = 3,
    ) -> None:
        self.exchange = exchange
        self.dead_exchange = f"{exchange}.dead"
        self.dead_casts = f"{exchange}.dead-letter.casts"
        self.dead_calls = f"{exchange}.dead-letter.calls"
        self.delivery_limit = delivery_limit
        self.queue_expires = queue_expires
        self.quorum_group_size = quorum_group_size

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
            GROUP_SIZE_ARGUMENT: self.quorum_group_size,
            **self._expires(),
        }

    async def declare_exchanges(
        self, channel: AbstractChannel, *, passive: bool = False
    ) -> tuple[AbstractExchange, AbstractExchange]:
        """The topic exchange and the dead-letter exchange.

        ``passive`` only checks that both exist: for an agent connecting as its own
        broker user, which may declare nothing shared (:mod:`shared.rpc.agent_users`).
        """
        try:
            if passive:
                exchange = await channel.declare_exchange(self.exchange, passive=True)
                dead = await channel.declare_exchange(self.dead_exchange, passive=True)
            else:
                exchange = await channel.declare_exchange(
                    self.exchange, ExchangeType.TOPIC, durable=True
                )
                dead = await channel.declare_exchange(
                    self.dead_exchange, ExchangeType.TOPIC, durable=True
                )
        except ChannelNotFoundEntity:
            raise TopologyMissing(
                f"exchange {self.exchange} or {self.dead_exchange} does not exist on the "
                "broker, and this agent's broker user may not declare it: start "
                "keel-conductor first (it declares them)"
            ) from None
        except ChannelPreconditionFailed as exc:
            raise MessagingError(
                f"exchange {self.exchange} or {self.dead_exchange} exists on the broker with "
                f"other settings: {exc}; delete it or choose another KEEL_EXCHANGE"
            ) from None
        return exchange, dead

    def dead_letter_queue_arguments(self, *, calls: bool) -> dict[str, Any]:
        kept = {"x-max-length": DEAD_CALLS_KEPT, "x-overflow": "drop-head"} if calls else {}
        return {"x-queue-type": "quorum", **kept, **self._expires()}

    async def declare_dead_letter_queues(self, connection: AbstractConnection) -> None:
        """The two dead-letter queues, bound to the dead-letter exchange.

        Both are quorum queues, replicated like the topic queues. A dead-calls queue an
        older keel declared as a classic queue is kept as it is, with a warning: it
        lives on one node only, and while that node is down dead calls are dropped
        (their callers were told already) and this is logged at each reconnection.
        """
        for name, calls, key in (
            (self.dead_casts, False, f"{CAST}.#"),
            (self.dead_calls, True, f"{CALL}.#"),
        ):
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(
                    name, durable=True, arguments=self.dead_letter_queue_arguments(calls=calls)
                )
                await queue.bind(self.dead_exchange, routing_key=key)
            except ChannelPreconditionFailed as exc:
                if not calls:
                    raise MessagingError(
                        f"queue {name} exists on the broker with other settings: {exc}; "
                        "delete it or choose another KEEL_EXCHANGE"
                    ) from None
                LOG.warning(
                    "queue %s was declared by an older keel as a classic queue (%s): it has "
                    "no replicas; delete it (rabbitmqctl delete_queue %s) to have a quorum "
                    "queue declared instead",
                    name,
                    exc,
                    name,
                )
            except ChannelNotFoundEntity as exc:
                LOG.warning("queue %s is unavailable, its node being down: %s", name, exc)
            finally:
                if not channel.is_closed:
                    await channel.close()

    async def ensure_topic_queue(self, connection: AbstractConnection, topic: str) -> None:
        """Make sure ``topic``'s quorum queue exists, replacing an empty classic one."""
        name = self.queue_name(topic)
        try:
            await self._declare_on_own_channel(connection, name)
            return
        except ChannelPreconditionFailed as exc:
            conflict = str(exc)
        if GROUP_SIZE_ARGUMENT in conflict:
            # Created before with another initial group size (or by a keel that set
            # none): the size only counts at creation, the members are the operator's.
            LOG.debug("queue %s exists with another initial group size: %s", name, conflict)
            return
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

    async def is_consumed(self, connection: AbstractConnection, topic: str) -> bool:
        """Whether ``topic``'s queue exists and has a consumer (a passive declaration)."""
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(self.queue_name(topic), passive=True)
        except ChannelNotFoundEntity:
            return False
        finally:
            if not channel.is_closed:
                await channel.close()
        return bool(queue.declaration_result.consumer_count)

    async def _declare_on_own_channel(self, connection: AbstractConnection, name: str) -> None:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, durable=True, arguments=self.topic_queue_arguments())
        finally:
            if not channel.is_closed:
                await channel.close()

    async def bind_topic_queue(self, channel: AbstractChannel, topic: str) -> AbstractQueue:
        """Bind ``topic``'s queue, which :meth:`ensure_topic_queue` made sure exists."""
        queue = await channel.declare_queue(self.queue_name(topic), passive=True)
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
        self, connection: AbstractConnection, *, calls: bool, limit: int
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

    async def purge(self, connection: AbstractConnection, *, calls: bool) -> int:
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
