"""keel-scheduler: the composition root.

Connects to PostgreSQL and RabbitMQ, registers this scheduler's own service row
(binary ``keel-scheduler``; two schedulers on one host share it), heartbeats it in the
database every report interval, and serves ``select_destinations`` on the ``scheduler``
topic as one of possibly many competing consumers. On SIGTERM it stops consuming, lets
requests in flight finish (bounded by the RPC call timeout: nobody waits longer for
them), then closes the transport and the pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack

import asyncpg

from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import RPC_VERSION, TOPIC
from shared.config import Settings
from shared.db.pool import create_pool
from shared.objects.service import Binary
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from shared.rpc.transport import Transport
from shared.runtime import Lifecycle, repeat, run
from shared.service_record import ServiceRecord

LOG = logging.getLogger(__name__)


async def run_scheduler(
    settings: Settings, lifecycle: Lifecycle, pool: asyncpg.Pool, transport: Transport
) -> None:
    """Serve until ``lifecycle.stopping`` is set, then drain."""
    record = ServiceRecord(pool, settings, binary=Binary.SCHEDULER, topic=TOPIC)
    await record.register()
    manager = SchedulerManager(pool, HostManager(service_down_time=settings.service_down_time))
    server = RPCServer(transport, TOPIC, manager, version=RPC_VERSION)
    heartbeats = asyncio.create_task(
        repeat("heartbeat", record.heartbeat, settings.report_interval, lifecycle)
    )
    try:
        await server.start(prefetch=settings.rpc.prefetch)
        await lifecycle.stopping.wait()
    finally:
        LOG.info("stopping: draining requests in flight")
        await server.stop(drain_timeout=settings.rpc.call_timeout)
        lifecycle.stopping.set()
        await heartbeats


async def serve(settings: Settings, lifecycle: Lifecycle) -> None:
    async with AsyncExitStack() as stack:
        pool = await create_pool(settings.database_url, settings.database)
        stack.push_async_callback(pool.close)
        transport = AmqpTransport.from_settings(settings)
        await transport.connect()
        stack.push_async_callback(transport.close)
        await run_scheduler(settings, lifecycle, pool, transport)


def main(argv: Sequence[str] | None = None) -> None:
    run(
        "keel-scheduler",
        serve,
        argv,
        description="Choose a compute host for each new instance and claim its resources.",
    )
