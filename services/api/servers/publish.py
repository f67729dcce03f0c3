"""Sending what keel-api recorded: 202 means it will happen, 503 that nothing will.

keel-api records a request (a server, a task) in the database, then casts it. A cast
whose outcome is unknown — the connection dropped before the broker confirmed it — may
still have reached the broker, so keel-api sends it again (every receiver is idempotent)
a few times, with short pauses. If it still cannot, the caller withdraws what it wrote
with a compare-and-swap that succeeds only while nothing has acted on it, and answers
503; if the swap shows the work was already taken, the answer is the normal one. keel-api
never reverts the database behind a message that has been acted on, and a message that
arrives after its withdrawal acts on nothing: an agent takes the request it carries
before acting on a guest (``instance_actions.take``, through the conductor), and a
conductor places a server, or starts a move, only while its record is still there.

An unroutable cast (no queue bound: its agent never started, or was deleted) is
definite, not retried: nothing was delivered.

A withdrawal the database cannot take (it is unreachable, or its connection dropped) is
not a 503 either: the cast may have reached the broker, and the request is still
recorded, not withdrawn. keel-api answers as if it was sent, and what stands behind each
record carries it through: the conductors send a delete, soft delete or restore no agent
took again (``services.conductor.promised_requests``), and any other task ends by its
deadline. (A create does the same in ``create``: a server it cannot withdraw is placed
and built, or put in ERROR by its build deadline.)

A request whose recording lost its answer (the connection dropped at the commit) is
answered 503, as the database could not be reached; it may be recorded all the same, so
keel-api withdraws it before answering (a dropped connection is replaced at once), or,
if the database cannot be reached then, in the background once it answers again
(:func:`record`: deletes, power actions, rebuilds, snapshots and moves; creates in
``create``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar
from uuid import UUID

import asyncpg
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random_exponential

from shared.db import instance_actions
from shared.db.errors import describe, is_transient, is_unavailable
from shared.db.pool import Connection
from shared.db.transaction import in_transaction, withdrawal
from shared.exceptions import MessagingError, Unroutable

LOG = logging.getLogger(__name__)

#: Attempts at a cast whose outcome is unknown, and the pause before each retry.
ATTEMPTS = 3
PAUSE = 0.5


async def send(cast: Callable[[], Awaitable[None]], *, what: str) -> MessagingError | None:
    """Run ``cast``, again on an ambiguous failure; ``None`` once sent, else the last error.

    :class:`~shared.exceptions.Unroutable` is raised at once.
    """
    error: MessagingError | None = None
    for attempt in range(1, ATTEMPTS + 1):
        try:
            await cast()
        except Unroutable:
            raise
        except MessagingError as exc:
            error = exc
        except Exception as exc:
            if not is_transient(exc):
                raise
            # A client reads the services' versions to pick its message's version: with
            # the database out, nothing was sent; the caller withdraws, or answers as sent
            # if it cannot (the request stands either way until one of them is done).
            error = MessagingError(
                f"the database could not be read before sending ({describe(exc)}): nothing was sent"
            )
        else:
            return None
        if attempt < ATTEMPTS:
            LOG.warning(
                "sending %s failed (attempt %d of %d: %s); sending it again",
                what,
                attempt,
                ATTEMPTS,
                error.message,
            )
            await asyncio.sleep(PAUSE * attempt)
    return error


#: Withdraws what keel-api recorded, or answers as sent when the database cannot be
#: reached (see the module docstring).
withdraw = withdrawal


T = TypeVar("T")


async def record(
    pool: asyncpg.Pool,
    work: Callable[[Connection], Awaitable[T]],
    *,
    what: str,
    withdraw: Callable[[Connection], Awaitable[bool]],
    instance_uuid: UUID,
    request_id: str,
) -> T:
    """Run ``work``, the transaction that records a request, as :func:`in_transaction`
    does. If the connection drops once ``work`` has run (at the commit: the request may
    be recorded), ``withdraw`` runs first (:func:`withdraw_now_or_later`), then the error
    is raised (503); a failure before that left nothing to withdraw."""
    ran = False

    async def tracked(conn: Connection) -> T:
        nonlocal ran
        ran = False
        result = await work(conn)
        ran = True
        return result

    try:
        return await in_transaction(pool, tracked, what=what)
    except Exception as exc:
        if ran and is_unavailable(exc):
            await withdraw_now_or_later(
                pool,
                withdraw,
                instance_uuid=instance_uuid,
                request_id=request_id,
                what=f"withdrawing after {what}",
            )
        raise


def _if_recorded(
    work: Callable[[Connection], Awaitable[bool]], instance_uuid: UUID, request_id: str
) -> Callable[[Connection], Awaitable[bool]]:
    async def if_recorded(conn: Connection) -> bool:
        return await instance_actions.recorded(conn, instance_uuid, request_id) and await work(conn)

    return if_recorded


async def withdraw_now_or_later(
    pool: asyncpg.Pool,
    work: Callable[[Connection], Awaitable[bool]],
    *,
    instance_uuid: UUID,
    request_id: str,
    what: str,
) -> None:
    """Withdraw, before answering, a request whose recording lost its answer (``work``,
    if its record exists): a dropped connection is replaced at once, so this usually
    settles it, and the 503 that follows is true. If the database cannot be reached
    now, the withdrawal goes on in the background (:func:`withdraw_unconfirmed`)."""
    try:
        withdrawn = await in_transaction(
            pool, _if_recorded(work, instance_uuid, request_id), what=what
        )
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        withdraw_unconfirmed(
            pool, work, instance_uuid=instance_uuid, request_id=request_id, what=what
        )
        return
    _log_unconfirmed(what, withdrawn)


def _log_unconfirmed(what: str, withdrawn: bool) -> None:
    LOG.warning(
        "%s: %s",
        what,
        "it was recorded, though answered 503: withdrawn"
        if withdrawn
        else "it was not recorded (or no longer stands): nothing to withdraw",
        extra={"decision": "unconfirmed_request"},
    )


#: Seconds keel-api keeps trying to withdraw a request whose recording went unanswered.
UNCONFIRMED_WITHIN = 600.0
#: The withdrawals running in the background (held so they are not collected).
_unconfirmed: set[asyncio.Task[None]] = set()


def withdraw_unconfirmed(
    pool: asyncpg.Pool,
    work: Callable[[Connection], Awaitable[bool]],
    *,
    instance_uuid: UUID,
    request_id: str,
    what: str,
) -> None:
    """The transaction that recorded request ``request_id`` of a server lost its answer
    (the connection dropped at its commit): the request may be recorded, though nothing
    was sent and the caller answers 503. Withdraw it (``work``) in the background, once
    the database answers again (for up to :data:`UNCONFIRMED_WITHIN` seconds), so that
    nothing sends it later (the conductors send again a delete no agent took); if the
    request has no record, nothing was written and nothing is done."""

    if_recorded = _if_recorded(work, instance_uuid, request_id)

    async def run() -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_unavailable),
            stop=stop_after_delay(UNCONFIRMED_WITHIN),
            wait=wait_random_exponential(multiplier=0.5, max=5.0),
            reraise=True,
        )
        try:
            withdrawn: bool = await retrying(in_transaction, pool, if_recorded, what=what)
        except Exception as exc:
            LOG.error(
                "%s: could not find out within %gs whether the request was recorded (%s)",
                what,
                UNCONFIRMED_WITHIN,
                describe(exc),
                extra={"decision": "unconfirmed_request"},
            )
            return
        _log_unconfirmed(what, withdrawn)

    task = asyncio.create_task(run(), name=f"keel-withdraw-unconfirmed: {what}")
    _unconfirmed.add(task)
    task.add_done_callback(_unconfirmed.discard)
