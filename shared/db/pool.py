"""The asyncpg connection pool: created once in ``main``, passed to whoever queries."""

from __future__ import annotations

import json
import logging

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from shared.config import DatabaseSettings

LOG = logging.getLogger(__name__)

Pool = asyncpg.Pool
#: What query functions accept: a plain connection or one borrowed from the pool.
Connection = asyncpg.Connection | PoolConnectionProxy

_CONNECT_ERRORS = (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(kind, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    LOG.warning(
        "database not reachable yet (attempt %d, %.0fs so far): %s",
        state.attempt_number,
        state.seconds_since_start or 0.0,
        error,
    )


async def create_pool(url: str, settings: DatabaseSettings) -> asyncpg.Pool:
    """Connect, retrying with jittered backoff for ``settings.connect_timeout`` seconds."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(_CONNECT_ERRORS),
        stop=stop_after_delay(settings.connect_timeout),
        wait=wait_random_exponential(multiplier=0.5, max=5),
        before_sleep=_log_retry,
        reraise=True,
    ):
        with attempt:
            pool: asyncpg.Pool = await asyncpg.create_pool(
                url,
                min_size=settings.pool_min_size,
                max_size=settings.pool_max_size,
                init=_init_connection,
            )
    return pool
