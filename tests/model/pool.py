"""A process's view of the shared database pool, with a checkpoint before every step.

Every keel process of the model gets its own :class:`ModelPool` over one real asyncpg
pool. It behaves as the pool (``acquire()``, the connection's query methods and
``transaction()``), and before each step that may commit something — a statement
outside a transaction, the start of a transaction — it awaits the world's checkpoint
for its process. That is where the model pauses a handler or kills its process:
between two awaits that touch the database, never inside a transaction (a process
killed inside one loses it to a rollback, which a kill just before it already covers;
and a handler paused inside one would hold its row locks against everyone else).

It also counts the database operations in flight, so the world knows when every task
is waiting on something only the model can release (:meth:`World.idle`), and fails the
next connections a process asks for when the model says the database is unreachable
for it (:attr:`ModelPool.outage`), or drops the connection of its next commits just
after PostgreSQL committed (:attr:`ModelPool.lost_commits`).

Steps go to PostgreSQL one at a time (:meth:`InFlight.turn`). Two tasks running at once
— two activities resumed together, a handler beside a timer — would otherwise see their
statements answered in whatever order the server finished them, and one example could
end differently from one run to the next (a failure Hypothesis calls flaky and cannot
shrink). One at a time, in the order the loop asked, an example replays what it did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import asyncpg

#: Real seconds a database step waits for the one in flight before it goes anyway.
LOCK_WAIT = 0.2

#: ``checkpoint(what)``: awaited before each step; may pause, or raise CancelledError.
Checkpoint = Callable[[str], Awaitable[None]]


class InFlight:
    """Database operations started and not yet finished, over every process."""

    def __init__(self) -> None:
        self._count = 0
        #: Steps let past one in flight after ``LOCK_WAIT`` (a row lock between them).
        self.let_past = 0
        #: Set while nothing is in flight (what a waiter for quiet waits on).
        self.none = asyncio.Event()
        self.none.set()
        #: Open transactions per task: no checkpoint fires inside one.
        self.depth: dict[asyncio.Task[Any], int] = {}

    @property
    def count(self) -> int:
        return self._count

    async def turn(self) -> None:
        """Wait until no other step is in flight: one step at a time, in the order the
        loop asked for them, so two tasks' statements are answered in the same order on
        every replay. A step that waits on a row lock another task holds (inside its
        transaction, its next step queued here) is let past after ``LOCK_WAIT``."""
        while self._count:
            try:
                async with asyncio.timeout(LOCK_WAIT):
                    await self.none.wait()
            except TimeoutError:
                self.let_past += 1
                return

    def started(self) -> None:
        self._count += 1
        self.none.clear()

    def finished(self) -> None:
        self._count -= 1
        if not self._count:
            self.none.set()

    def in_transaction(self) -> bool:
        task = asyncio.current_task()
        return task is not None and self.depth.get(task, 0) > 0

    def enter(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.depth[task] = self.depth.get(task, 0) + 1

    def leave(self) -> None:
        task = asyncio.current_task()
        if task is None:
            return
        left = self.depth.get(task, 0) - 1
        if left > 0:
            self.depth[task] = left
        else:
            self.depth.pop(task, None)


class _Counted:
    """``async with`` around an awaitable step, counting it as in flight."""

    def __init__(self, inflight: InFlight) -> None:
        self.inflight = inflight

    async def run(self, step: Awaitable[Any]) -> Any:
        await self.inflight.turn()
        self.inflight.started()
        try:
            return await step
        finally:
            self.inflight.finished()


class ModelTransaction:
    def __init__(self, conn: ModelConnection, inner: Any) -> None:
        self._conn = conn
        self._inner = inner

    async def __aenter__(self) -> ModelTransaction:
        await self._conn.checkpoint("transaction")
        await self._conn.counted(self._inner.__aenter__())
        self._conn.inflight.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._conn.inflight.leave()
        result: bool | None = await self._conn.counted(self._inner.__aexit__(exc_type, exc, tb))
        pool = self._conn.pool
        if exc_type is None and pool.lost_commits > 0 and not self._conn.inflight.in_transaction():
            # Committed; its answer is lost on the way back.
            pool.lost_commits -= 1
            raise asyncpg.ConnectionDoesNotExistError(
                "connection was closed in the middle of operation (injected: the commit "
                "was done, its answer lost)"
            )
        return result


class ModelConnection:
    """A pooled connection whose steps pass the process's checkpoint."""

    def __init__(self, inner: Any, pool: ModelPool) -> None:
        self._inner = inner
        self._checkpoint = pool.checkpoint
        self.inflight = pool.inflight
        self.pool = pool

    async def checkpoint(self, what: str) -> None:
        if not self.inflight.in_transaction():
            await self._checkpoint(what)

    async def counted(self, step: Awaitable[Any]) -> Any:
        return await _Counted(self.inflight).run(step)

    async def _query(self, method: str, *args: Any, **kwargs: Any) -> Any:
        await self.checkpoint(method)
        return await self.counted(getattr(self._inner, method)(*args, **kwargs))

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        return await self._query("execute", *args, **kwargs)

    async def executemany(self, *args: Any, **kwargs: Any) -> Any:
        return await self._query("executemany", *args, **kwargs)

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._query("fetch", *args, **kwargs)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        return await self._query("fetchrow", *args, **kwargs)

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        return await self._query("fetchval", *args, **kwargs)

    async def fetchmany(self, *args: Any, **kwargs: Any) -> Any:
        return await self._query("fetchmany", *args, **kwargs)

    def transaction(self, **kwargs: Any) -> ModelTransaction:
        return ModelTransaction(self, self._inner.transaction(**kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Acquire:
    def __init__(self, pool: ModelPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._ctx: Any = None

    async def __aenter__(self) -> ModelConnection:
        pool = self._pool
        if not pool.inflight.in_transaction():
            await pool.checkpoint("acquire")
        if pool.outage > 0:
            pool.outage -= 1
            raise ConnectionRefusedError("the database cannot be reached (injected)")
        self._ctx = pool.inner.acquire(timeout=self._timeout)
        inner = await _Counted(pool.inflight).run(self._ctx.__aenter__())
        return ModelConnection(inner, pool)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await _Counted(self._pool.inflight).run(self._ctx.__aexit__(exc_type, exc, tb))


class ModelPool:
    """One process's pool: the shared asyncpg pool behind that process's checkpoint."""

    def __init__(self, inner: asyncpg.Pool, checkpoint: Checkpoint, inflight: InFlight) -> None:
        self.inner = inner
        self.checkpoint = checkpoint
        self.inflight = inflight
        #: Connections still to be refused, as if the database were unreachable.
        self.outage = 0
        #: Commits still to lose their answer: done, then the connection drops.
        self.lost_commits = 0

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        return _Acquire(self, timeout)

    async def _direct(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async with self.acquire() as conn:
            return await getattr(conn, method)(*args, **kwargs)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        return await self._direct("execute", *args, **kwargs)

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._direct("fetch", *args, **kwargs)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        return await self._direct("fetchrow", *args, **kwargs)

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        return await self._direct("fetchval", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
