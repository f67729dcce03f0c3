"""An in-memory transport for unit tests: the real interface, no broker.

Several :class:`FakeTransport` objects that share one :class:`FakeBroker` behave like
processes on one RabbitMQ: a topic is routable once someone has served it, messages wait
in its queue while no consumer is attached, competing consumers share the work, and a
rejected message lands on the dead-letter list.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field

from shared.exceptions import MessagingError, MessagingTimeout, Unroutable
from shared.rpc.transport import Consumer, Handler, IncomingMessage, RejectMessage, Transport

LOG = logging.getLogger(__name__)


@dataclass
class _Queue:
    pending: deque[IncomingMessage] = field(default_factory=deque)
    consumers: list[_FakeConsumer] = field(default_factory=list)
    next_consumer: int = 0


class FakeBroker:
    """The shared state of fake transports: queues, reply addresses, dead letters."""

    def __init__(self) -> None:
        self.queues: dict[str, _Queue] = {}
        self.reply_boxes: dict[str, FakeTransport] = {}
        self.dead: list[bytes] = []

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


class _FakeConsumer(Consumer):
    def __init__(
        self, broker: FakeBroker, topic: str, handler: Handler, prefetch: int, owner: FakeTransport
    ) -> None:
        self.broker = broker
        self.topic = topic
        self.handler = handler
        self.prefetch = prefetch
        self.owner = owner
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopped = False

    def has_room(self) -> bool:
        return not self.stopped and len(self.tasks) < self.prefetch

    def deliver(self, message: IncomingMessage) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(message))
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.broker.consumer_freed(self.topic)

    async def _handle(self, message: IncomingMessage) -> None:
        try:
            reply = await self.handler(message)
        except RejectMessage as exc:
            self.broker.dead.append(message.body)
            reply = exc.reply
        except Exception:
            LOG.exception("handler failed on %s; dead-lettering", self.topic)
            self.broker.dead.append(message.body)
            reply = None
        if reply is not None and message.reply_to and message.correlation_id:
            box = self.broker.reply_boxes.get(message.reply_to)
            if box is not None:
                box.deliver_reply(message.correlation_id, reply)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        self.stopped = True
        queue = self.broker.queues.get(self.topic)
        if queue is not None and self in queue.consumers:
            queue.consumers.remove(self)
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=drain_timeout)


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
        consumer = _FakeConsumer(self.broker, topic, handler, prefetch, self)
        queue = self.broker.queues.setdefault(topic, _Queue())
        queue.consumers.append(consumer)
        self._consumers.append(consumer)
        self.broker.consumer_freed(topic)
        return consumer

    async def dead_letters(self, limit: int = 100) -> list[bytes]:
        taken = self.broker.dead[:limit]
        del self.broker.dead[:limit]
        return taken
