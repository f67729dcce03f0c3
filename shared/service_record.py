"""What the services with database access (conductor, scheduler) run the same way.

Their own row in ``services``, stamped directly in the database (compute agents
heartbeat through the conductor instead; several copies of one service on one host
share one row), the pool and transport they are built on, and the serve-then-drain loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import asyncpg
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from shared.config import Settings
from shared.db import services
from shared.db.errors import describe, is_unavailable
from shared.db.pool import create_pool
from shared.exceptions import ServiceNotFound
from shared.metrics import Metrics
from shared.objects.service import Binary, Service
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from shared.runtime import Lifecycle, repeat
from shared.version_checks import check_against_the_rest, check_computes_supported
from shared.version_pins import MinimumVersions

LOG = logging.getLogger(__name__)


class ServiceRecord:
    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        binary: Binary,
        topic: str,
        minimums: MinimumVersions,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.binary = binary
        self.topic = topic
        self.version = settings.service_version
        self.minimums = minimums
        self.service: Service | None = None

    async def check(self) -> None:
        """Refuse to run, before writing anything, if this service is too old or too new.

        Too old: older than every other service of its binary. Too new: too old compute
        services are registered (unless the fast-forward workaround is set).
        """
        await check_computes_supported(self.pool, self.settings, self.binary.value)
        await check_against_the_rest(
            self.pool,
            self.minimums,
            binary=self.binary.value,
            host=self.settings.host,
            version=self.version,
        )

    async def register(self) -> Service:
        """Create or refresh the row for (host, binary), with this release's version."""
        async with self.pool.acquire() as conn:
            self.service = await services.get_or_create(
                conn,
                host=self.settings.host,
                binary=self.binary.value,
                topic=self.topic,
                version=self.version,
                down_time=self.settings.service_down_time,
            )
        LOG.info(
            "registered as %s service %s (host %s, version %d)",
            self.binary.value,
            self.service.uuid,
            self.service.host,
            self.version,
        )
        return self.service

    async def heartbeat(self) -> None:
        """Stamp ``last_seen_up`` and the version; register again if the row was deleted."""
        service = self.service or await self.register()
        try:
            async with self.pool.acquire() as conn:
                await services.heartbeat(conn, service.uuid, self.version)
        except ServiceNotFound:
            LOG.warning("service row %s was deleted; registering again", service.uuid)
            service = await self.register()
            async with self.pool.acquire() as conn:
                await services.heartbeat(conn, service.uuid, self.version)


async def _until_the_database_answers(record: ServiceRecord, within: float) -> None:
    """Check and register, again while the database cannot be reached (a restart or a
    failover under way), for ``within`` seconds: a service that starts during a moment's
    outage waits it out instead of exiting."""

    def log(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        LOG.warning(
            "cannot register yet (attempt %d, %.0fs so far): %s; trying again",
            state.attempt_number,
            state.seconds_since_start or 0.0,
            describe(error) if error is not None else "?",
        )

    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_unavailable),
        stop=stop_after_delay(within),
        # Short waits: an outage that ends is noticed within two seconds.
        wait=wait_random_exponential(multiplier=0.2, max=2.0),
        before_sleep=log,
        reraise=True,
    ):
        with attempt:
            await record.check()
            await record.register()


@asynccontextmanager
async def connected(
    settings: Settings, metrics: Metrics | None = None
) -> AsyncIterator[tuple[asyncpg.Pool, AmqpTransport]]:
    """The database pool (its commands timed in ``metrics``, if given) and the broker
    transport, closed in reverse order on exit."""
    async with AsyncExitStack() as stack:
        pool = await create_pool(settings.database_url, settings.database, metrics)
        stack.push_async_callback(pool.close)
        transport = AmqpTransport.from_settings(settings)
        await transport.connect()
        stack.push_async_callback(transport.close)
        yield pool, transport


@dataclass(frozen=True)
class Periodic:
    """Work a service repeats while it runs, e.g. the conductor's build deadline."""

    what: str
    action: Callable[[], Awaitable[object]]
    interval: float


async def serve_until_stopped(
    record: ServiceRecord,
    server: RPCServer,
    lifecycle: Lifecycle,
    *,
    drain_timeout: float,
    periodic: Sequence[Periodic] = (),
) -> None:
    """Register, serve, then heartbeat until stopping; then drain in-flight work (bounded).

    The service is reported up by its first heartbeat, once its queue is consumed: nobody
    is told to send work to a service before it can take it.
    """
    settings = record.settings
    await _until_the_database_answers(record, settings.database.connect_timeout)
    tasks: list[asyncio.Task[None]] = []
    try:
        await server.start(prefetch=settings.rpc.prefetch)
        tasks.append(
            asyncio.create_task(
                repeat("heartbeat", record.heartbeat, settings.report_interval, lifecycle)
            )
        )
        for job in periodic:
            tasks.append(asyncio.create_task(repeat(job.what, job.action, job.interval, lifecycle)))
        await lifecycle.stopping.wait()
    finally:
        LOG.info("stopping: draining work in flight (at most %.0fs)", drain_timeout)
        await server.stop(drain_timeout=drain_timeout)
        lifecycle.stopping.set()
        await asyncio.gather(*tasks)
