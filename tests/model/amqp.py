"""The model over RabbitMQ: the same machine, its messages carried by a real broker.

Every process gets a real :class:`~shared.rpc.amqp.AmqpTransport` on a test exchange,
wrapped in a :class:`RelayedTransport`. RabbitMQ routes, queues, delivers, requeues and
dead-letters; the relay only parks each cast once RabbitMQ has delivered it to its
consumer (unacknowledged), until the model delivers it to keel's handler, whose
settlement then goes back to RabbitMQ (ack, nack and requeue, dead-letter). So the
model still decides the order of deliveries, and the faults are those a real broker
has: a lost acknowledgement is a nack with requeue (RabbitMQ delivers it again, its
delivery count raised), a duplicate is the same message published twice, a killed
process closes its connection (RabbitMQ returns what it held to the queue).

Messages in flight are tracked by message id — sent, not yet parked (or, for a call, not
yet answered) — so :meth:`Relay.in_transit` tells :meth:`Runtime.idle` whether RabbitMQ
still has something on its way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shared.exceptions import MessagingError
from shared.rpc.amqp import AmqpTransport
from shared.rpc.fake import CallFault, HeldMessage
from shared.rpc.transport import (
    Consumer,
    DeadLetter,
    Handler,
    IncomingMessage,
    Settle,
    Settlement,
    Transport,
)
from tests.model.runtime import Broker, ModelTransport, Runtime

LOG = logging.getLogger(__name__)

#: Seconds a message may stay "on its way" before the relay stops waiting for it (one
#: RabbitMQ dead-lettered at its delivery limit never arrives).
GIVE_UP = 3.0


@dataclass(eq=False)
class _Parked:
    transport: RelayedTransport
    handler: Handler
    future: asyncio.Future[Settlement] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Relay(Broker):
    """The model's view of RabbitMQ: parked casts, and what is still on its way."""

    def __init__(self, url: str, exchange: str, call_timeout: float) -> None:
        self.url = url
        self.exchange = exchange
        self.call_timeout = call_timeout
        self.held: list[HeldMessage] = []
        self.dead_casts: list[DeadLetter] = []
        self.dead_calls: list[DeadLetter] = []
        self.transports: list[RelayedTransport] = []
        self._parked: dict[HeldMessage, _Parked] = {}
        self._seq = itertools.count()
        #: Casts sent (or returned to their queue) and not parked yet, by message id.
        self._expected: Counter[str] = Counter()
        self._topics: dict[str, str] = {}
        #: Calls sent and not answered yet; calls whose handler has answered.
        self._calls: dict[str, str] = {}
        self._answered: set[str] = set()
        self._received: set[str] = set()
        self._since: float | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # -- the model's side ----------------------------------------------------------------

    def deliver(self, held: HeldMessage, *, lose_ack: bool = False) -> asyncio.Task[None]:
        parked = self._parked.pop(held)
        self.held.remove(held)

        async def run() -> None:
            settlement = await parked.handler(held.message)
            if settlement.settle is Settle.DEAD_LETTER:
                self.dead_casts.append(
                    DeadLetter(held.message.body, held.topic, "cast", "rejected", settlement.reason)
                )
            if lose_ack or settlement.settle is Settle.REQUEUE:
                # A nack with requeue: RabbitMQ delivers it again, delivery count raised.
                self._expect(held.topic, held.message)
                settlement = Settlement(Settle.REQUEUE, None, "acknowledgement lost (model)")
            if not parked.future.done():
                parked.future.set_result(settlement)

        return asyncio.get_running_loop().create_task(run())

    def duplicate(self, held: HeldMessage) -> HeldMessage:
        """Publish ``held`` again (the same id): RabbitMQ delivers a second copy."""
        sender = next((t for t in self.transports if t.alive), None)
        if sender is not None:
            self._expect(held.topic, held.message)
            task = asyncio.get_running_loop().create_task(
                sender.inner.cast(held.topic, held.message.body, message_id=_id(held.message))
            )
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return held

    def consumers(self, topic: str) -> list[Any]:
        return [t for t in self.transports if t.alive and topic in t.topics]

    def expire_calls(self) -> int:
        return 0  # RabbitMQ expires them (their TTL is the call timeout)

    async def in_transit(self) -> bool:
        """Whether RabbitMQ still has a message on its way to a consumer or a caller."""
        if self._closing:
            await asyncio.wait(set(self._closing))
            return True
        waiting = [
            m for m, n in self._expected.items() if n > 0 and self.consumers(self._topics[m])
        ]
        # A call is on its way until a handler takes it (or RabbitMQ expires it), and its
        # reply until the caller has it; while its handler runs, its caller just waits.
        waiting += [m for m in self._calls if m in self._answered or m not in self._received]
        if not waiting:
            self._since = None
            return False
        loop = asyncio.get_running_loop()
        if self._since is None:
            self._since = loop.time()
        elif loop.time() - self._since > max(GIVE_UP, self.call_timeout + 1):
            LOG.warning(
                "model: stopped waiting for %s",
                [(m, self._topics.get(m), self._expected[m], self._calls.get(m)) for m in waiting],
            )
            self._expected.clear()
            self._since = None
            return False
        return True

    # -- the transports' side ------------------------------------------------------------

    def _expect(self, topic: str, message: IncomingMessage) -> None:
        mid = _id(message)
        self._expected[mid] += 1
        self._topics[mid] = topic

    def sent(self, topic: str, message_id: str) -> None:
        self._expected[message_id] += 1
        self._topics[message_id] = topic

    def park(
        self, transport: RelayedTransport, topic: str, message: IncomingMessage, handler: Handler
    ) -> asyncio.Future[Settlement]:
        mid = _id(message)
        if self._expected[mid] > 0:
            self._expected[mid] -= 1
        held = HeldMessage(next(self._seq), topic, message)
        parked = _Parked(transport, handler)
        self._parked[held] = parked
        self.held.append(held)
        return parked.future

    def drop(self, transport: RelayedTransport) -> None:
        """A killed process: what it held goes back to its queues (RabbitMQ does it)."""
        for held, parked in list(self._parked.items()):
            if parked.transport is transport:
                del self._parked[held]
                self.held.remove(held)
                parked.future.cancel()
                self._expect(held.topic, held.message)
        task = asyncio.get_running_loop().create_task(transport.inner.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def call_sent(self, topic: str, message_id: str) -> None:
        self._calls[message_id] = topic

    def call_received(self, message_id: str) -> None:
        self._received.add(message_id)

    def call_answered(self, message_id: str) -> None:
        self._answered.add(message_id)

    def call_done(self, message_id: str) -> None:
        self._calls.pop(message_id, None)
        self._answered.discard(message_id)
        self._received.discard(message_id)


def _id(message: IncomingMessage) -> str:
    return message.message_id or ""


class RelayedTransport(Transport):
    """A process's AMQP transport, its casts parked by the relay until delivered."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.inner = AmqpTransport(relay.url, relay.exchange, queue_expires=120, connect_timeout=10)
        self.before_publish: Callable[[str], Awaitable[None]] | None = None
        self.topics: set[str] = set()
        self.alive = False
        self._faults: list[bool] = []
        relay.transports.append(self)

    async def connect(self) -> None:
        await self.inner.connect()
        self.alive = True

    async def close(self) -> None:
        self.alive = False
        await self.inner.close()

    def kill(self) -> None:
        if self.alive:
            self.alive = False
            self.relay.drop(self)

    def serves(self, topic: str) -> bool:
        return self.alive and topic in self.topics

    def fail_next_cast(self, *, delivered: bool) -> None:
        self._faults.append(delivered)

    def pending_cast_faults(self) -> list[bool]:
        return list(self._faults)

    def disturb_next_call(self, fault: CallFault) -> None:
        """Over RabbitMQ a call is never disturbed on purpose: its own faults are real."""

    def disarm_faults(self) -> None:
        self._faults.clear()

    async def _checkpoint(self, topic: str) -> None:
        if not self.alive:
            raise MessagingError("transport killed")
        if self.before_publish is not None:
            await self.before_publish(topic)

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        await self._checkpoint(topic)
        self.relay.call_sent(topic, message_id)
        try:
            return await self.inner.call(topic, body, message_id=message_id, timeout=timeout)
        finally:
            self.relay.call_done(message_id)

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        await self._checkpoint(topic)
        fault = self._faults.pop(0) if self._faults else None
        if fault is False:
            raise MessagingError(f"publish to {topic} failed (injected): nothing was sent")
        self.relay.sent(topic, message_id)
        await self.inner.cast(topic, body, message_id=message_id)
        if fault is True:
            raise MessagingError(f"publish to {topic} unconfirmed (injected): it was sent")

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        async def relayed(message: IncomingMessage) -> Settlement:
            if message.is_call:
                self.relay.call_received(_id(message))
                settlement = await handler(message)
                self.relay.call_answered(_id(message))
                return settlement
            return await self.relay.park(self, topic, message, handler)

        consumer = await self.inner.serve(topic, relayed, prefetch=max(prefetch, 64))
        self.topics.add(topic)
        return consumer

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        return await self.inner.dead_letters(limit, calls=calls)

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        return await self.inner.purge_dead_letters(calls=calls)


class AmqpRuntime(Runtime):
    """The model's runtime with RabbitMQ as its broker (a new exchange per example)."""

    def __init__(self, db: Any, url: str, call_timeout: float) -> None:
        self.url = url
        self.call_timeout = call_timeout
        self.exchanges: list[str] = []
        super().__init__(db)

    def new_broker(self) -> Broker:
        exchange = f"keel-model-{len(self.exchanges)}-{id(self):x}"
        self.exchanges.append(exchange)
        return Relay(self.url, exchange, self.call_timeout)

    def new_transport(self) -> ModelTransport:
        assert isinstance(self.broker, Relay)
        return RelayedTransport(self.broker)

    async def in_transit(self) -> bool:
        assert isinstance(self.broker, Relay)
        return await self.broker.in_transit()
