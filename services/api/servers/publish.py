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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from shared.db.errors import describe, is_transient
from shared.db.transaction import withdrawal
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
