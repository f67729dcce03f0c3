"""The interface between keel's RPC layer and a message broker.

A transport moves bytes; :mod:`shared.rpc.client` and :mod:`shared.rpc.server` give them
meaning. Two implementations exist: :class:`shared.rpc.amqp.AmqpTransport` (RabbitMQ,
for real) and :class:`shared.rpc.fake.FakeTransport` (in memory, for unit tests). One
contract test suite runs against both.

Contract:

* ``serve(topic, handler)`` consumes the queue for ``topic``, creating it if needed. For
  each message it awaits ``handler``. If the message has a ``reply_to``, the bytes the
  handler returns are sent there with the message's correlation id. The message is
  acknowledged after the handler returns. If the handler raises :class:`RejectMessage`,
  its reply (if any) is still sent, and the message is rejected without requeue, to the
  dead-letter queue.
* ``call`` publishes to ``topic`` and waits for the reply; it raises
  :class:`~shared.exceptions.Unroutable` at once when no queue exists for the topic, and
  :class:`~shared.exceptions.MessagingTimeout` when no reply comes in time.
* ``cast`` publishes and returns; it also raises ``Unroutable`` when no queue exists.
* Closing fails every call still waiting with a ``MessagingError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class IncomingMessage:
    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    redelivered: bool = False


class RejectMessage(Exception):
    """Raised by a handler to dead-letter the message it is handling."""

    def __init__(self, reason: str, reply: bytes | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reply = reply


Handler = Callable[[IncomingMessage], Awaitable[bytes | None]]


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
    async def dead_letters(self, limit: int = 100) -> list[bytes]:
        """Take up to ``limit`` messages off the dead-letter queue (for operators and tests)."""
