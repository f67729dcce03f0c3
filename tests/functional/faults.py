"""A database or broker call that fails once, for handlers run again after it.

Every handler runs at least once: when one of its database or broker calls fails (a
connection dropped mid-query, a commit whose answer never came back, a publish RabbitMQ
did not confirm), the message is delivered again, or the client asks again, and the
handler runs from the top. A test proves it converges by failing each of the handler's
calls in turn and running it again:

* :class:`FailsOnce` wraps an ``asyncpg`` pool. It counts the handler's database calls
  in order (each ``acquire()``, each statement, each transaction's commit) and makes
  call number ``at`` raise :class:`asyncpg.ConnectionDoesNotExistError`, once: it never
  reached PostgreSQL, and the transaction it was in is rolled back. With
  ``answered=True`` the call is carried out first and only its answer is lost; then
  only the calls whose answer matters are numbered (each commit, each statement outside
  a transaction): a statement inside one is rolled back with it either way.
* :class:`BrokerFailsOnce` wraps a :class:`~shared.rpc.transport.Transport` the same
  way for calls and casts, raising the :class:`~shared.exceptions.MessagingError` a
  publish RabbitMQ did not confirm ends in; with ``answered=True`` the message went out
  (and a call was handled) first.
* :func:`every_call` runs a scenario with the fault at call 0, 1, 2, … until a run
  whose calls were all made without reaching ``at``: every call of the handler has
  then failed once.

The servers themselves are never touched (for a cut of the real connection, see
:mod:`tests.faults.proxy`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, cast

import asyncpg

from shared.exceptions import MessagingError
from shared.rpc.transport import Consumer, DeadLetter, Handler, Transport

#: The connection methods that send a statement.
_STATEMENTS = frozenset({"execute", "executemany", "fetch", "fetchrow", "fetchval"})


class _Countdown:
    """Counts calls; call number ``at`` is the one that fails (once)."""

    def __init__(self, at: int | None, answered: bool) -> None:
        self.at = at
        self.answered = answered
        #: What each call was, in order (``acquire``, a statement's first words, ``commit``).
        self.calls: list[str] = []
        #: How many of them were numbered (could have been the one to fail).
        self.numbered = 0

    def arm(self, at: int | None, *, answered: bool = False) -> None:
        """Count again from 0, with call number ``at`` to fail (a long-lived holder of
        the pool or transport, such as an API app, serves several scenarios)."""
        self.at, self.answered, self.calls, self.numbered = at, answered, [], 0

    @property
    def failed(self) -> bool:
        return self.at is not None and self.numbered > self.at

    def due(self, what: str, *, answer_matters: bool = True) -> bool:
        """Count a call; True if it is the one to fail. A call whose answer does not
        matter is not numbered when only answers are lost."""
        self.calls.append(what)
        if self.answered and not answer_matters:
            return False
        self.numbered += 1
        return self.at is not None and self.numbered - 1 == self.at

    def describe(self) -> str:
        lost = "its answer lost" if self.answered else "failed"
        return f"call {self.at} ({self.calls[-1]}): {lost} (injected)"


class FailsOnce(_Countdown):
    """A pool whose database call number ``at`` fails, once (``None``: none does)."""

    def __init__(self, pool: asyncpg.Pool, at: int | None = 0, *, answered: bool = False) -> None:
        super().__init__(at, answered)
        self._pool = pool

    def as_pool(self) -> asyncpg.Pool:
        """This, as the pool type handlers are declared to take."""
        return cast("asyncpg.Pool", self)

    def error(self) -> asyncpg.ConnectionDoesNotExistError:
        return asyncpg.ConnectionDoesNotExistError(self.describe())

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        return _Acquire(self, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class _Acquire:
    def __init__(self, faulty: FailsOnce, timeout: float | None) -> None:
        self._faulty = faulty
        self._timeout = timeout
        self._borrowed: Any = None

    async def __aenter__(self) -> _Connection:
        if self._faulty.due("acquire", answer_matters=False):
            raise self._faulty.error()
        self._borrowed = self._faulty._pool.acquire(timeout=self._timeout)
        conn = await self._borrowed.__aenter__()
        return _Connection(self._faulty, conn)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._borrowed.__aexit__(kind, exc, tb)
        return result


class _Connection:
    """A borrowed connection whose statements and commits count."""

    def __init__(self, faulty: FailsOnce, conn: Any) -> None:
        self._faulty = faulty
        self._conn = conn

    def transaction(self, **kwargs: Any) -> _Transaction:
        return _Transaction(self._faulty, self._conn.transaction(**kwargs))

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._conn, name)
        if name not in _STATEMENTS:
            return found

        async def statement(query: str, *args: Any, **kwargs: Any) -> Any:
            what = " ".join(query.split()[:3])
            if not self._faulty.due(what, answer_matters=not self._conn.is_in_transaction()):
                return await found(query, *args, **kwargs)
            if not self._faulty.answered:
                raise self._faulty.error()
            await found(query, *args, **kwargs)
            raise self._faulty.error()

        return statement


class _Transaction:
    """A transaction whose commit counts: failed, it is rolled back (or, answered,
    committed) and the error raised."""

    def __init__(self, faulty: FailsOnce, transaction: Any) -> None:
        self._faulty = faulty
        self._transaction = transaction

    async def __aenter__(self) -> _Transaction:
        await self._transaction.__aenter__()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if kind is not None or not self._faulty.due("commit"):
            result: bool | None = await self._transaction.__aexit__(kind, exc, tb)
            return result
        error = self._faulty.error()
        if self._faulty.answered:
            await self._transaction.__aexit__(None, None, None)
        else:
            await self._transaction.__aexit__(type(error), error, None)
        raise error


class BrokerFailsOnce(_Countdown, Transport):
    """A transport whose call or cast number ``at`` fails, once (``None``: none does)."""

    def __init__(self, transport: Transport, at: int | None = 0, *, answered: bool = False) -> None:
        super().__init__(at, answered)
        self._transport = transport

    def error(self) -> MessagingError:
        return MessagingError(f"the publish was not confirmed by RabbitMQ: {self.describe()}")

    async def _send(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if not self.due(what):
            return await send()
        if self.answered:
            await send()
        raise self.error()

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        answer: bytes = await self._send(
            f"call {topic}",
            lambda: self._transport.call(topic, body, message_id=message_id, timeout=timeout),
        )
        return answer

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        await self._send(
            f"cast {topic}", lambda: self._transport.cast(topic, body, message_id=message_id)
        )

    async def connect(self) -> None:
        await self._transport.connect()

    async def close(self) -> None:
        await self._transport.close()

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        return await self._transport.serve(topic, handler, prefetch=prefetch)

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        return await self._transport.dead_letters(limit, calls=calls)

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        return await self._transport.purge_dead_letters(calls=calls)

    async def is_consumed(self, topic: str) -> bool | None:
        return await self._transport.is_consumed(topic)


async def every_call(scenario: Callable[[int], Awaitable[_Countdown]], *, most: int = 60) -> int:
    """Run ``scenario(at)`` for ``at`` = 0, 1, 2, … until a run in which the fault never
    fired (every call the handler makes has failed once by then); how many calls that
    last run numbered. ``scenario`` returns the :class:`FailsOnce` or
    :class:`BrokerFailsOnce` it used, and asserts what must hold after its fault."""
    for at in range(most):
        faulty = await scenario(at)
        if not faulty.failed:
            assert at > 0, "the scenario made no call that could fail"
            return faulty.numbered
    raise AssertionError(f"the scenario still made a call numbered {most}: raise most=")
