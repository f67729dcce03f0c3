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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

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
            if attempt < ATTEMPTS:
                LOG.warning(
                    "sending %s failed (attempt %d of %d: %s); sending it again",
                    what,
                    attempt,
                    ATTEMPTS,
                    exc.message,
                )
                await asyncio.sleep(PAUSE * attempt)
            continue
        return None
    return error
