"""Transactions that are run again when they lose a race.

PostgreSQL rolls back a transaction that hit a serialization failure or a deadlock; the
right answer is to run the whole transaction again, not to report an error.
:func:`in_transaction` does that a bounded number of times, with jittered backoff and a
log line per retry. Any other error, and a conflict on the last attempt, is raised to
the caller (see :mod:`shared.db.errors` for what counts as a conflict).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import asyncpg
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from shared.db.errors import describe, is_conflict, is_transient
from shared.db.pool import Connection

LOG = logging.getLogger(__name__)

T = TypeVar("T")

#: How many times a transaction runs at most before its conflict is raised.
MAX_ATTEMPTS = 5

Isolation = Literal["read_committed", "repeatable_read", "serializable"]


def _retrying(what: str, attempts: int) -> AsyncRetrying:
    def log_retry(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        LOG.warning(
            "%s lost a race with another transaction (%s); running it again (attempt %d of %d)",
            what,
            describe(error) if error else "conflict",
            state.attempt_number + 1,
            attempts,
        )

    return AsyncRetrying(
        retry=retry_if_exception(is_conflict),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.02, max=0.5),
        before_sleep=log_retry,
        reraise=True,
    )


async def in_transaction(
    pool: asyncpg.Pool,
    work: Callable[[Connection], Awaitable[T]],
    *,
    what: str,
    isolation: Isolation | None = None,
    attempts: int = MAX_ATTEMPTS,
) -> T:
    """Run ``work(conn)`` in a transaction on a pooled connection; again on a conflict.

    ``work`` may run several times, each time in a fresh transaction, so it must do
    nothing outside the database that cannot be repeated. ``what`` names the work in
    the log lines (e.g. ``"recording server X"``).
    """
    async for attempt in _retrying(what, attempts):
        with attempt:
            async with pool.acquire() as conn, conn.transaction(isolation=isolation):
                result = await work(conn)
    return result


async def withdrawal(
    pool: asyncpg.Pool, work: Callable[[Connection], Awaitable[bool]], *, what: str
) -> bool:
    """Run the withdrawal ``work`` (of a request whose message may or may not have gone
    out) in a transaction: True if it withdrew the request; False if the request stands,
    because its receiver took it or because the database could not be reached to
    withdraw it. A caller answers as if it was sent then (it may have been): what stands
    behind the record carries it through or ends it by its deadline."""
    try:
        return await in_transaction(pool, work, what=what)
    except Exception as exc:
        if not is_transient(exc):
            raise
        LOG.warning(
            "%s failed: the database is unavailable (%s); the request stands, and is "
            "answered as sent (it may have been)",
            what,
            describe(exc),
            extra={"decision": "withdrawal_failed"},
        )
        return False
