"""The asyncpg connection pool: created once in ``main``, passed to whoever queries.

Every wait on the database is bounded, so an outage turns into errors a caller can
handle instead of requests that hang:

* ``acquire()`` waits at most ``acquire_timeout`` seconds for a connection, connecting
  a new one included (:class:`KeelPool` applies it to every caller);
* each SQL command fails after ``command_timeout`` seconds.

A connection that broke (the server restarted, the network was cut) is dropped by the
pool when it is released and replaced by a fresh one on the next ``acquire()``, so the
pool recovers by itself once PostgreSQL is back: no process needs a restart. Whether an
error is worth retrying is decided in :mod:`shared.db.errors`.

With a primary and standbys, ``KEEL_DATABASE_URL`` names them all and asks for the one
that takes writes, as libpq does::

    postgresql://keel:secret@db1:5432,db2:5432/keel?target_session_attrs=read-write

Every new connection tries the servers in turn and keeps the first that is a primary.
When the primary dies, the pool's connections to it break, and the next ones go to
whichever standby was promoted; until one is, connecting fails as an outage does (a
503 from keel-api, a transient failure for an RPC handler).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from asyncpg.connection import LoggedQuery
from asyncpg.pool import PoolAcquireContext, PoolConnectionProxy
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from shared.config import DatabaseSettings
from shared.metrics import Metrics

LOG = logging.getLogger(__name__)

Pool = asyncpg.Pool
#: What query functions accept: a plain connection or one borrowed from the pool.
Connection = asyncpg.Connection | PoolConnectionProxy

_CONNECT_ERRORS = (
    OSError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.TargetServerAttributeNotMatched,
)
#: asyncpg's defaults for what keel does not configure.
_MAX_QUERIES = 50_000
_MAX_INACTIVE_LIFETIME = 300.0


class KeelConnection(asyncpg.Connection):
    """A pooled connection that goes back to the pool without asyncpg's reset query.

    asyncpg resets every connection on release (advisory locks, cursors, ``LISTEN``,
    settings): one more round trip, and one more transaction for PostgreSQL, per
    ``acquire()`` — a sixth of the statements of a boot. keel leaves no session state on
    a pooled connection: its locks are transaction-scoped (``pg_advisory_xact_lock``), it
    declares no cursor, listens to nothing and sets nothing (a unit test keeps it so;
    ``db sync`` releases its session lock itself). A transaction left open is still
    rolled back on release.
    """

    def get_reset_query(self) -> str:
        return ""


class KeelPool(asyncpg.Pool):
    """An asyncpg pool whose ``acquire()`` is bounded by default.

    Built only by :func:`create_pool`; everything else sees an ``asyncpg.Pool``.
    """

    def __init__(self, dsn: str, *, acquire_timeout: float, **kwargs: Any) -> None:
        self.acquire_timeout = acquire_timeout
        super().__init__(dsn, **kwargs)

    def acquire(self, *, timeout: float | None = None) -> PoolAcquireContext:
        return super().acquire(timeout=self.acquire_timeout if timeout is None else timeout)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(kind, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


#: The first words of SQL commands counted under their own name; others count as ``other``.
_VERBS = frozenset({"select", "insert", "update", "delete", "with"})


def query_verb(query: str) -> str:
    """``select``, ``insert``, ``update``, ``delete``, ``with`` or ``other``: the metric label."""
    word = query.lstrip().split(None, 1)[0].lower() if query.strip() else ""
    return word if word in _VERBS else "other"


def _timed(metrics: Metrics) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """A connection initialiser that also times every command on the connection."""

    def observe(logged: LoggedQuery) -> None:
        metrics.db_query_seconds.labels(verb=query_verb(logged.query)).observe(logged.elapsed)

    async def init(conn: asyncpg.Connection) -> None:
        await _init_connection(conn)
        conn.add_query_logger(observe)

    return init


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    LOG.warning(
        "database not reachable yet (attempt %d, %.0fs so far): %s",
        state.attempt_number,
        state.seconds_since_start or 0.0,
        error,
    )


def _new_pool(url: str, settings: DatabaseSettings, metrics: Metrics | None) -> KeelPool:
    return KeelPool(
        url,
        acquire_timeout=settings.acquire_timeout,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        max_queries=_MAX_QUERIES,
        max_inactive_connection_lifetime=_MAX_INACTIVE_LIFETIME,
        init=_init_connection if metrics is None else _timed(metrics),
        loop=None,
        connection_class=KeelConnection,
        record_class=asyncpg.Record,
        # Passed to every new connection: how long connecting and each command may take.
        timeout=settings.acquire_timeout,
        command_timeout=settings.command_timeout,
    )


async def create_pool(
    url: str, settings: DatabaseSettings, metrics: Metrics | None = None
) -> asyncpg.Pool:
    """Connect, retrying with jittered backoff for ``settings.connect_timeout`` seconds.

    With ``metrics``, every SQL command is timed (``keel_db_query_seconds``).
    """
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(_CONNECT_ERRORS),
        stop=stop_after_delay(settings.connect_timeout),
        wait=wait_random_exponential(multiplier=0.5, max=5),
        before_sleep=_log_retry,
        reraise=True,
    ):
        with attempt:
            pool: asyncpg.Pool = await _new_pool(url, settings, metrics)
    return pool
