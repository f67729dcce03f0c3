"""An in-memory transport for unit tests: the real interface, no broker.

Several :class:`FakeTransport` objects that share one :class:`FakeBroker` behave like
processes on one RabbitMQ: a topic is routable once someone has served it, messages wait
in its queue while no consumer is attached, competing consumers share the work, and
settlement follows the transport contract — a requeued message comes back with its
delivery count raised until the broker's delivery limit dead-letters it.

Tests can also cut a transport's connection while its handlers run
(:meth:`FakeTransport.lose_connection`): the messages it held go back to their queues and
are delivered again, possibly to another consumer, while the first handlers carry on —
the at-least-once situation every handler must survive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field

from shared.exceptions import MessagingError, MessagingTimeout, Unroutable
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


@dataclass(eq=False)
class _Delivery:
    """One delivery of a message; settling it twice, or after the connection died, is void."""

    topic: str
    message: IncomingMessage
    settled: bool = False


@dataclass
class _Queue:
    pending: deque[IncomingMessage] = field(default_factory=deque)
    consumers: list[_FakeConsumer] = field(default_factory=list)
    next_consumer: int = 0


class FakeBroker:
    """The shared state of fake transports: queues, reply addresses, dead letters."""

    def __init__(self, *, delivery_limit: int = 5) -> None:
        self.delivery_limit = delivery_limit
        self.queues: dict[str, _Queue] = {}
        self.reply_boxes: dict[str, FakeTransport] = {}
        self.dead_casts: list[DeadLetter] = []
        self.dead_calls: list[DeadLetter] = []

    def publish(self, topic: str, message: IncomingMessage) -> None:
        queue = self.queues.get(topic)
        if queue is None:
            raise Unroutable(f"no queue is bound for topic {topic!r}")
        queue.pending.append(message)
        self._dispatch(queue)

    def _dispatch(self, queue: _Queue) -> None:
        while queue.pending:
            ready = [c for c in queue.consumers if c.has_room()]
            if not ready:
                return
            consumer = ready[queue.next_consumer % len(ready)]
            queue.next_consumer += 1
            consumer.deliver(queue.pending.popleft())

    def consumer_freed(self, topic: str) -> None:
        queue = self.queues.get(topic)
        if queue is not None:
            self._dispatch(queue)

    def settle(self, delivery: _Delivery, settlement: Settlement) -> None:
        if delivery.settled:
            return
        delivery.settled = True
        if settlement.settle is Settle.ACK:
            return
        if settlement.settle is Settle.DEAD_LETTER:
            self.dead_letter(delivery, "rejected", settlement.reason)
            return
        self.redeliver(delivery)

    def redeliver(self, delivery: _Delivery) -> None:
        """Return a message to its queue, or dead-letter it past the delivery limit."""
        message = delivery.message
        if message.delivery_count >= self.delivery_limit:
            self.dead_letter(delivery, "delivery_limit", "")
            return
        again = dataclasses.replace(
            message, redelivered=True, delivery_count=message.delivery_count + 1
        )
        queue = self.queues.get(delivery.topic)
        if queue is not None:
            queue.pending.append(again)
            self._dispatch(queue)

    def dead_letter(self, delivery: _Delivery, reason: str, detail: str) -> None:
        message = delivery.message
        dead = DeadLetter(
            body=message.body,
            topic=delivery.topic,
            kind="call" if message.is_call else "cast",
            reason=reason,
            detail=detail,
            delivery_count=message.delivery_count + 1,
            message_id=message.message_id,
        )
        (self.dead_calls if message.is_call else self.dead_casts).append(dead)


class _FakeConsumer(Consumer):
    def __init__(self, broker: FakeBroker, topic: str, handler: Handler, prefetch: int) -> None:
        self.broker = broker
        self.topic = topic
        self.handler = handler
        self.prefetch = prefetch
        self.tasks: set[asyncio.Task[None]] = set()
        #: Deliveries handed to this consumer and not yet settled.
        self.held: set[_Delivery] = set()
        self.stopped = False

    def has_room(self) -> bool:
        return not self.stopped and len(self.held) < self.prefetch

    def deliver(self, message: IncomingMessage) -> None:
        delivery = _Delivery(self.topic, message)
        self.held.add(delivery)
        task = asyncio.get_running_loop().create_task(self._handle(delivery))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, delivery: _Delivery) -> None:
        message = delivery.message
        try:
            settlement = await self.handler(message)
        except Exception as exc:
            LOG.exception("handler failed on %s; dead-lettering", self.topic)
            settlement = Settlement(Settle.DEAD_LETTER, None, f"{type(exc).__name__}: {exc}")
        if not delivery.settled:
            if settlement.reply is not None and message.reply_to and message.correlation_id:
                box = self.broker.reply_boxes.get(message.reply_to)
                if box is not None:
                    box.deliver_reply(message.correlation_id, settlement.reply)
            self.broker.settle(delivery, settlement)
        self.held.discard(delivery)
        self.broker.consumer_freed(self.topic)

    def lose_connection(self) -> None:
        """Return every held message to the queue, as a broker does for a dead channel."""
        held, self.held = self.held, set()
        for delivery in held:
            delivery.settled = True
            self.broker.redeliver(delivery)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        self.stopped = True
        queue = self.broker.queues.get(self.topic)
        if queue is not None and self in queue.consumers:
            queue.consumers.remove(self)
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=drain_timeout)
        self.lose_connection()


class FakeTransport(Transport):
    def __init__(self, broker: FakeBroker | None = None) -> None:
        self.broker = broker if broker is not None else FakeBroker()
        self.reply_address = f"reply.{uuid.uuid4()}"
        self._waiting: dict[str, asyncio.Future[bytes]] = {}
        self._consumers: list[_FakeConsumer] = []
        self._open = False

    async def connect(self) -> None:
        self.broker.reply_boxes[self.reply_address] = self
        self._open = True

    async def close(self) -> None:
        self._open = False
        self.broker.reply_boxes.pop(self.reply_address, None)
        for consumer in list(self._consumers):
            await consumer.stop(0)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(MessagingError("transport closed"))
        self._waiting.clear()

    def lose_connection(self) -> None:
        """Cut the connection under running handlers; consumers come back by themselves.

        Messages this transport's consumers hold return to their queues at once and are
        delivered again (``redelivered``, delivery count raised); the handlers already
        running finish, but their settlements go nowhere.
        """
        for consumer in self._consumers:
            consumer.lose_connection()
        for consumer in self._consumers:
            self.broker.consumer_freed(consumer.topic)

    def _check_open(self) -> None:
        if not self._open:
            raise MessagingError("transport is not connected")

    def deliver_reply(self, correlation_id: str, body: bytes) -> None:
        future = self._waiting.get(correlation_id)
        if future is not None and not future.done():
            future.set_result(body)

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        self._check_open()
        correlation_id = str(uuid.uuid4())
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        try:
            self.broker.publish(
                topic,
                IncomingMessage(
                    body=body,
                    message_id=message_id,
                    correlation_id=correlation_id,
                    reply_to=self.reply_address,
                ),
            )
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise MessagingTimeout(f"no reply from {topic} within {timeout:g}s") from None
        finally:
            self._waiting.pop(correlation_id, None)

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        self._check_open()
        self.broker.publish(topic, IncomingMessage(body=body, message_id=message_id))

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        self._check_open()
        consumer = _FakeConsumer(self.broker, topic, handler, prefetch)
        queue = self.broker.queues.setdefault(topic, _Queue())
        queue.consumers.append(consumer)
        self._consumers.append(consumer)
        self.broker.consumer_freed(topic)
        return consumer

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        return list((self.broker.dead_calls if calls else self.broker.dead_casts)[:limit])

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        dead = self.broker.dead_calls if calls else self.broker.dead_casts
        count = len(dead)
        dead.clear()
        return count
