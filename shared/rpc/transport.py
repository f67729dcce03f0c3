"""The interface between keel's RPC layer and a message broker.

A transport moves bytes; :mod:`shared.rpc.client` and :mod:`shared.rpc.server` give them
meaning, and :mod:`shared.rpc.settlement` decides what becomes of each message. Two
implementations exist: :class:`shared.rpc.amqp.AmqpTransport` (RabbitMQ, for real) and
:class:`shared.rpc.fake.FakeTransport` (in memory, for unit tests). One contract test
suite runs against both.

Contract:

* ``serve(topic, handler)`` consumes the queue for ``topic``, creating it if needed. For
  each message it awaits ``handler``, which returns a :class:`Settlement`: if the message
  has a ``reply_to`` and the settlement carries a reply, the reply is sent there with the
  message's correlation id; then the message is settled as the settlement says —
  acknowledged, returned to the queue (its delivery count goes up; once it exceeds the
  queue's delivery limit the broker dead-letters it), or dead-lettered with a reason. A
  handler that raises is a bug: the message is dead-lettered with the error as reason.
* A message delivered again (after its consumer's connection was lost mid-handle, or
  after a requeue) carries ``redelivered`` and its ``delivery_count`` (0 the first time).
* ``call`` publishes to ``topic`` and waits for the reply; it raises
  :class:`~shared.exceptions.Unroutable` at once when no queue exists for the topic, and
  :class:`~shared.exceptions.MessagingTimeout` when no reply comes in time.
* ``cast`` publishes, persistent, and returns once the broker has taken the message; it
  also raises ``Unroutable`` when no queue exists.
* Closing fails every call still waiting with a ``MessagingError``.
* ``dead_letters`` shows what was dead-lettered, without removing it; ``purge_dead_letters``
  removes it. Casts and calls are kept apart: a dead cast is lost work an operator must
  look at, a dead call was already reported to its caller as an error or a timeout.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class IncomingMessage:
    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    redelivered: bool = False
    #: How many times the broker delivered this message before (0 the first time).
    delivery_count: int = 0
    #: This process's monotonic clock when the message arrived: deadlines count from it.
    received_at: float = field(default_factory=time.monotonic)
    #: The broker user that published it (AMQP ``user_id``, checked by RabbitMQ against
    #: the publishing connection); ``None`` where the transport has no users.
    user_id: str | None = None

    @property
    def is_call(self) -> bool:
        return bool(self.reply_to)


class Settle(enum.Enum):
    """What becomes of a message once its handler is done with it."""

    #: Handled, for better or worse (a business error is an answer too): remove it.
    ACK = "ack"
    #: A transient failure: deliver it again (the queue's delivery limit bounds this).
    REQUEUE = "requeue"
    #: It can never be handled: move it to the dead-letter queue for an operator.
    DEAD_LETTER = "dead-letter"


@dataclass(frozen=True)
class Settlement:
    settle: Settle
    #: Sent to the caller before the message is settled, if it waits for one.
    reply: bytes | None = None
    #: Why the message was requeued or dead-lettered (logged, and kept with a dead letter).
    reason: str = ""


@dataclass(frozen=True)
class DeadLetter:
    """A message on a dead-letter queue, as an operator inspects it."""

    body: bytes
    #: The topic the message was sent to.
    topic: str
    #: ``cast`` or ``call``.
    kind: str
    #: ``rejected`` (by keel, with ``detail`` saying why), ``delivery_limit`` (delivered
    #: too often without being settled), ``expired`` (a call nobody answered in time)…
    reason: str
    detail: str = ""
    delivery_count: int = 0
    message_id: str | None = None


Handler = Callable[[IncomingMessage], Awaitable[Settlement]]


class Consumer(ABC):
    """A running subscription to one topic's queue."""

    @abstractmethod
    async def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop taking messages, then wait up to ``drain_timeout`` for those in flight."""


class Transport(ABC):
    @abstractmethod
    async def connect(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        """Publish ``body`` to ``topic`` and return the reply's body."""

    @abstractmethod
    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        """Publish ``body`` to ``topic`` without waiting for anything but the broker."""

    @abstractmethod
    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        """Start consuming ``topic``; see the module docstring for the contract."""

    @abstractmethod
    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        """Up to ``limit`` dead casts (or calls), oldest first, left where they are."""

    @abstractmethod
    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        """Remove every dead cast (or call); return how many were removed."""

    async def is_consumed(self, topic: str) -> bool | None:
        """Whether a consumer is attached to ``topic``'s queue right now.

        ``None`` when the transport cannot tell; callers then go on as if it were. A
        caller that must not wait a whole call timeout for a process that is gone (an
        agent that died before its service was reported down) asks this first.
        """
        return None

    def on_connection_lost(self, listener: Callable[[str], None]) -> None:  # noqa: B027
        """Call ``listener`` with the reason each time the broker connection is lost.

        Not abstract: a transport without a connection of its own to lose (the in-memory
        one, a view of a shared one) never calls it.
        """
