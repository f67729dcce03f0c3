"""The settlement policy: what becomes of every message once its handler has run.

Messages are delivered at least once, so a handler may run again for the same message at
any time, even while its first run is still going. Given that, each outcome of a handler
is settled in one of three ways, decided here and nowhere else:

* **Done** — the handler returned, or raised a business error (any
  :class:`~shared.exceptions.KeelError` that is not transient: ``NoValidHost``,
  ``InstanceNotFound``…). That is the answer: the message is acknowledged, and a call
  gets the result or the error by name.
* **Transient** — a failure that says nothing about the request: the database or the
  broker unreachable, a connection lost mid-query, a serialization failure or deadlock,
  a downstream call that timed out, found no consumer or lost its reply queue with its
  broker connection, or a handler raising
  :class:`~shared.exceptions.TransientError` on purpose. The handler is run again within
  the same delivery, with jittered exponential backoff, for at most
  ``handler_retry_timeout`` seconds. If it still fails, a cast is returned to its queue
  to be delivered again later, and once it has been delivered ``delivery_limit`` times
  it is dead-lettered with the reason; a call is answered with ``TransientError`` (its
  caller is waiting and decides what to do).
* **Poison** — anything else: a bug, or a message that cannot be handled. It is logged
  with its traceback and dead-lettered at once (a call also gets the error), so the
  service keeps serving the messages behind it.

No cast is ever dropped silently: every message leaves its queue acknowledged after its
handler finished, or dead-lettered with a log line naming it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from shared.config import RpcSettings
from shared.db import errors as db_errors
from shared.exceptions import (
    KeelError,
    MessagingError,
    MessagingTimeout,
    ReplyQueueLost,
    TransientError,
    Unroutable,
)

LOG = logging.getLogger(__name__)

T = TypeVar("T")


class Outcome(enum.Enum):
    DONE = "done"
    TRANSIENT = "transient"
    POISON = "poison"


def is_transient(exc: BaseException) -> bool:
    """True for a failure that says nothing about the request (see the module docstring)."""
    if isinstance(
        exc, TransientError | MessagingTimeout | Unroutable | ReplyQueueLost | TimeoutError
    ):
        return True
    # A bare MessagingError is a broker connection failure; its other subclasses
    # (NoSuchMethod, UnsupportedVersion, InvalidMessage, RemoteError) are answers.
    if type(exc) is MessagingError:
        return True
    return db_errors.is_transient(exc)


def classify(exc: BaseException) -> Outcome:
    if is_transient(exc):
        return Outcome.TRANSIENT
    if isinstance(exc, KeelError):
        return Outcome.DONE
    return Outcome.POISON


def describe(exc: BaseException) -> str:
    """One line for logs and dead letters: the error's name and message."""
    text = exc.message if isinstance(exc, KeelError) else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class RetryPolicy:
    """How long transient failures are retried, within one delivery and across deliveries."""

    #: Seconds a handler is retried within one delivery before the message is requeued.
    handler_retry_timeout: float = 10.0
    #: Deliveries after the first before a failing cast is dead-lettered (the queue's
    #: ``x-delivery-limit``).
    delivery_limit: int = 5
    #: Upper bound of one backoff step, in seconds.
    max_backoff: float = 2.0

    @classmethod
    def from_settings(cls, rpc: RpcSettings) -> RetryPolicy:
        return cls(
            handler_retry_timeout=rpc.handler_retry_timeout, delivery_limit=rpc.delivery_limit
        )

    async def run(self, what: str, action: Callable[[], Awaitable[T]], extra: dict[str, Any]) -> T:
        """Run ``action``, retrying transient failures with jittered backoff (bounded)."""

        def log_retry(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            LOG.warning(
                "%s met a transient failure (attempt %d): %s; retrying in %.1fs",
                what,
                state.attempt_number,
                describe(error) if error else "?",
                state.upcoming_sleep,
                extra=extra,
            )

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_delay(self.handler_retry_timeout),
            wait=wait_random_exponential(multiplier=0.1, max=self.max_backoff),
            before_sleep=log_retry,
            reraise=True,
        ):
            with attempt:
                return await action()
        raise AssertionError("unreachable: the retry loop returns or raises")
