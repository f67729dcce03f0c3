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

Faults for the model-based test (``tests/model/``), which decides every delivery itself:

* a broker made with ``hold=`` keeps the messages that predicate picks (the model holds
  casts) in :attr:`FakeBroker.held` instead of handing them out; the test delivers any of
  them, in any order, with :meth:`FakeBroker.deliver` — optionally losing the
  acknowledgement after the handler ran, so the message comes back (``lose_ack``);
* :meth:`FakeBroker.duplicate` adds a second copy of a held message, as a publisher that
  repeats a publish whose confirm it never saw;
* :meth:`FakeTransport.kill` is a process killed between two awaits: its handlers are
  cancelled where they stand, its consumers dropped, the messages they held returned to
  their queues, its waiting calls failed;
* :meth:`FakeBroker.expire_calls` times out, at once, the calls waiting in a queue nobody
  consumes (RabbitMQ's per-message TTL on calls), instead of after real seconds;
* :attr:`FakeTransport.before_publish` is awaited before every publish, so a test can
  stop (or kill) a sender just before it sends;
* :meth:`FakeTransport.fail_next_cast` makes a cast raise ``MessagingError`` once: before
  the broker took the message, or after (the ambiguous publish: the sender cannot tell
  whether it went); :meth:`FakeTransport.disturb_next_call` does the like to a call — lost
  before or after the callee acted, delivered twice, or held for the test to deliver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

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


#: How a call may be disturbed (:meth:`FakeTransport.disturb_next_call`):
#: ``unsent`` — it never reaches the callee, and the caller times out;
#: ``early`` — the caller times out at once, the callee gets it and acts later;
#: ``reply_lost`` — the callee acts, its reply is lost, the caller times out;
#: ``twice`` — the callee gets it twice (the caller takes the first reply);
#: ``held`` — it waits in its queue for the test to deliver it, as a held cast does.
CallFault = Literal["unsent", "early", "reply_lost", "twice", "held"]


@dataclass(eq=False)
class _Delivery:
    """One delivery of a message; settling it twice, or after the connection died, is void."""

    topic: str
    message: IncomingMessage
    settled: bool = False


@dataclass(frozen=True)
class HeldMessage:
    """A message the broker holds until the test delivers it (see ``FakeBroker(hold=)``)."""

    #: Publication order over the whole broker: the order :attr:`FakeBroker.held` keeps.
    seq: int
    topic: str
    message: IncomingMessage


#: Which published (or returned) messages wait in :attr:`FakeBroker.held`.
HoldPolicy = Callable[[str, IncomingMessage], bool]


@dataclass
class _Queue:
    pending: deque[IncomingMessage] = field(default_factory=deque)
    consumers: list[_FakeConsumer] = field(default_factory=list)
    next_consumer: int = 0


class FakeBroker:
    """The shared state of fake transports: queues, reply addresses, dead letters."""

    def __init__(self, *, delivery_limit: int = 5, hold: HoldPolicy | None = None) -> None:
        self.delivery_limit = delivery_limit
        self.queues: dict[str, _Queue] = {}
        self.reply_boxes: dict[str, FakeTransport] = {}
        self.dead_casts: list[DeadLetter] = []
        self.dead_calls: list[DeadLetter] = []
        self.hold = hold
        #: Messages waiting for the test to deliver them, in publication order.
        self.held: list[HeldMessage] = []
        self._seq = itertools.count()

    def publish(self, topic: str, message: IncomingMessage, *, hold: bool = False) -> None:
        """Route ``message``; with ``hold``, keep it for the test whatever the policy."""
        queue = self.queues.get(topic)
        if queue is None:
            raise Unroutable(f"no queue is bound for topic {topic!r}")
        self._enqueue(topic, queue, message, hold=hold)

    def _enqueue(
        self, topic: str, queue: _Queue, message: IncomingMessage, *, hold: bool = False
    ) -> None:
        if hold or (self.hold is not None and self.hold(topic, message)):
            self.held.append(HeldMessage(next(self._seq), topic, message))
            return
        queue.pending.append(message)
        self._dispatch(queue)

    def consumers(self, topic: str) -> list[_FakeConsumer]:
        """The consumers attached to ``topic``'s queue now."""
        queue = self.queues.get(topic)
        return [] if queue is None else [c for c in queue.consumers if not c.stopped]

    def deliver(self, held: HeldMessage, *, lose_ack: bool = False) -> asyncio.Task[None]:
        """Hand a held message to a consumer of its topic now; return its handler's task.

        With ``lose_ack`` the handler runs (and a call's reply is sent) but its settlement
        never reaches the broker: the message returns to its queue, redelivered, as when
        a connection drops between a handler's end and its acknowledgement. Raises
        ``LookupError`` when nobody consumes the topic (the message stays held).
        """
        queue = self.queues.get(held.topic)
        live = self.consumers(held.topic)
        if queue is None or not live:
            raise LookupError(f"nobody consumes {held.topic!r}")
        self.held.remove(held)
        consumer = live[queue.next_consumer % len(live)]
        queue.next_consumer += 1
        return consumer.deliver(held.message, lose_ack=lose_ack)

    def duplicate(self, held: HeldMessage) -> HeldMessage:
        """Hold a second copy of ``held`` (same body and id), as a repeated publish."""
        copy = HeldMessage(next(self._seq), held.topic, held.message)
        self.held.append(copy)
        return copy

    def expire_calls(self) -> int:
        """Time out every call waiting in a queue nobody consumes; return how many.

        Each is dead-lettered as ``expired`` and its caller gets ``MessagingTimeout`` at
        once, as RabbitMQ's per-message TTL and the caller's timer would do later.
        """
        expired = 0
        for topic, queue in self.queues.items():
            if self.consumers(topic):
                continue
            calls = [m for m in queue.pending if m.is_call]
            for message in calls:
                queue.pending.remove(message)
                self._expire(topic, message)
                expired += 1
        for held in [h for h in self.held if h.message.is_call]:
            if not self.consumers(held.topic):
                self.held.remove(held)
                self._expire(held.topic, held.message)
                expired += 1
        return expired

    def _expire(self, topic: str, message: IncomingMessage) -> None:
        self.dead_calls.append(
            DeadLetter(
                body=message.body,
                topic=topic,
                kind="call",
                reason="expired",
                delivery_count=message.delivery_count,
                message_id=message.message_id,
            )
        )
        box = self.reply_boxes.get(message.reply_to or "")
        if box is not None and message.correlation_id:
            box.fail_call(
                message.correlation_id, MessagingTimeout(f"no reply from {topic}: expired")
            )

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
            self._enqueue(delivery.topic, queue, again)

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

    def deliver(self, message: IncomingMessage, *, lose_ack: bool = False) -> asyncio.Task[None]:
        delivery = _Delivery(self.topic, message)
        self.held.add(delivery)
        task = asyncio.get_running_loop().create_task(self._handle(delivery, lose_ack))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _handle(self, delivery: _Delivery, lose_ack: bool = False) -> None:
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
            if lose_ack:
                delivery.settled = True
                self.broker.redeliver(delivery)
            else:
                self.broker.settle(delivery, settlement)
        self.held.discard(delivery)
        self.broker.consumer_freed(self.topic)

    def lose_connection(self) -> None:
        """Return every held message to the queue, as a broker does for a dead channel."""
        held, self.held = self.held, set()
        for delivery in held:
            delivery.settled = True
            self.broker.redeliver(delivery)

    def detach(self) -> None:
        self.stopped = True
        queue = self.broker.queues.get(self.topic)
        if queue is not None and self in queue.consumers:
            queue.consumers.remove(self)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        self.detach()
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
        #: Awaited with the topic before every call and cast is published (a test's
        #: checkpoint: it may pause the sender there, or kill it).
        self.before_publish: Callable[[str], Awaitable[None]] | None = None
        #: One-shot failures of the next casts: True once the broker took the message.
        self._cast_faults: list[bool] = []
        #: One-shot disturbances of the next calls (see :meth:`disturb_next_call`).
        self._call_faults: list[CallFault] = []
        #: Calls whose reply is lost on its way back.
        self._lost_replies: set[str] = set()

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

    def kill(self) -> set[asyncio.Task[None]]:
        """This process dies now: handlers cancelled mid-flight, nothing settled by it.

        Its consumers are dropped, every message they held returns to its queue
        (redelivered, to another consumer or to this process once it serves again), its
        waiting calls fail, and the transport is closed. Returns the cancelled handler
        tasks (the caller may await them; the current task is not cancelled, it is the
        caller's to end).
        """
        self._open = False
        self.broker.reply_boxes.pop(self.reply_address, None)
        current = asyncio.current_task()
        cancelled: set[asyncio.Task[None]] = set()
        for consumer in self._consumers:
            consumer.detach()
            for task in consumer.tasks:
                if task is not current:
                    task.cancel()
                    cancelled.add(task)
        for consumer in self._consumers:
            consumer.lose_connection()
            self.broker.consumer_freed(consumer.topic)
        self._consumers.clear()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(MessagingError("transport killed"))
        self._waiting.clear()
        return cancelled

    def fail_next_cast(self, *, delivered: bool) -> None:
        """The next cast raises ``MessagingError``; with ``delivered``, after it went out."""
        self._cast_faults.append(delivered)

    def pending_cast_faults(self) -> list[bool]:
        """The failures armed for the next casts, in order (``delivered`` of each)."""
        return list(self._cast_faults)

    def disturb_next_call(self, fault: CallFault) -> None:
        """The next call of this transport is disturbed (see :data:`CallFault`)."""
        self._call_faults.append(fault)

    def disarm_faults(self) -> None:
        """The failures and disturbances armed for the next casts and calls will not
        happen: the broker that lost them works again."""
        self._cast_faults.clear()
        self._call_faults.clear()

    def serves(self, topic: str) -> bool:
        """Whether this transport consumes ``topic`` now."""
        return any(c.topic == topic and not c.stopped for c in self._consumers)

    async def is_consumed(self, topic: str) -> bool | None:
        """Whether any process on this broker consumes ``topic`` now."""
        queue = self.broker.queues.get(topic)
        return queue is not None and any(not c.stopped for c in queue.consumers)

    def handler_tasks(self) -> set[asyncio.Task[None]]:
        """The handlers this transport's consumers are running now."""
        return {task for consumer in self._consumers for task in consumer.tasks}

    def waiting_calls(self) -> int:
        """Calls of this transport still waiting for their reply."""
        return sum(1 for future in self._waiting.values() if not future.done())

    def fail_call(self, correlation_id: str, error: Exception) -> None:
        future = self._waiting.get(correlation_id)
        if future is not None and not future.done():
            future.set_exception(error)

    def _check_open(self) -> None:
        if not self._open:
            raise MessagingError("transport is not connected")

    def deliver_reply(self, correlation_id: str, body: bytes) -> None:
        future = self._waiting.get(correlation_id)
        if future is None or future.done():
            return
        if correlation_id in self._lost_replies:
            # The callee acted; its answer never comes back: the caller times out.
            future.set_exception(MessagingTimeout("no reply (lost on its way back: injected)"))
            return
        future.set_result(body)

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        self._check_open()
        if self.before_publish is not None:
            await self.before_publish(topic)
            self._check_open()
        fault = self._call_faults.pop(0) if self._call_faults else None
        if fault == "unsent":
            raise MessagingTimeout(f"no reply from {topic} (injected: the call never arrived)")
        correlation_id = str(uuid.uuid4())
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        if fault == "reply_lost":
            self._lost_replies.add(correlation_id)
        try:
            message = IncomingMessage(
                body=body,
                message_id=message_id,
                correlation_id=correlation_id,
                reply_to=self.reply_address,
            )
            self.broker.publish(topic, message, hold=fault == "held")
            if fault == "twice":
                self.broker.publish(topic, message)
            if fault == "early":
                raise MessagingTimeout(f"no reply from {topic} in time (injected)")
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise MessagingTimeout(f"no reply from {topic} within {timeout:g}s") from None
        finally:
            self._waiting.pop(correlation_id, None)
            self._lost_replies.discard(correlation_id)

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        self._check_open()
        if self.before_publish is not None:
            await self.before_publish(topic)
            self._check_open()
        fault = self._cast_faults.pop(0) if self._cast_faults else None
        if fault is False:
            raise MessagingError(f"publish to {topic} failed (injected): nothing was sent")
        self.broker.publish(topic, IncomingMessage(body=body, message_id=message_id))
        if fault is True:
            raise MessagingError(f"publish to {topic} unconfirmed (injected): it was sent")

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
