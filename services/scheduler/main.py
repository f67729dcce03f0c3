"""keel-scheduler: the composition root.

Connects to PostgreSQL and RabbitMQ, registers this scheduler's own service row
(binary ``keel-scheduler``; two schedulers on one host share it), heartbeats it in the
database every report interval, and serves ``select_destinations`` on the ``scheduler``
topic as one of possibly many competing consumers. On SIGTERM it stops consuming, lets
requests in flight finish (bounded by the RPC call timeout: nobody waits longer for
them), then closes the transport and the pool.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import asyncpg

from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import TOPIC
from shared.config import Settings
from shared.faults import FaultPoints
from shared.objects.service import Binary
from shared.rpc import agent_users
from shared.rpc.server import RPCServer
from shared.rpc.settlement import RetryPolicy
from shared.rpc.transport import Transport
from shared.runtime import Lifecycle, run
from shared.service_record import ServiceRecord, connected, serve_until_stopped
from shared.version_pins import MinimumVersions
from shared.versions import apis_for


async def run_scheduler(
    settings: Settings,
    lifecycle: Lifecycle,
    pool: asyncpg.Pool,
    transport: Transport,
    *,
    rng: random.Random | None = None,
) -> None:
    """Serve until ``lifecycle.stopping`` is set, then drain.

    ``rng`` picks among the best hosts (a test passes a seeded one to replay choices).
    """
    minimums = MinimumVersions(
        pool, ttl=settings.service_version_cache_ttl, metrics=lifecycle.metrics
    )
    record = ServiceRecord(pool, settings, binary=Binary.SCHEDULER, topic=TOPIC, minimums=minimums)
    manager = SchedulerManager(
        pool,
        HostManager(
            service_down_time=settings.service_down_time,
            host_subset_size=settings.scheduler.host_subset_size,
            rng=rng,
        ),
        FaultPoints(settings.fault_inject),
    )
    server = RPCServer(
        transport,
        TOPIC,
        manager,
        version=apis_for(settings.service_version).scheduler,
        policy=RetryPolicy.from_settings(settings.rpc),
        metrics=lifecycle.metrics,
        guard=agent_users.refuse_agents,
    )

    async def reload(new: Settings) -> None:
        minimums.ttl = new.service_version_cache_ttl
        minimums.reset()

    lifecycle.on_reload(reload)
    # Nobody waits for a selection longer than one call timeout.
    await serve_until_stopped(record, server, lifecycle, drain_timeout=settings.rpc.call_timeout)


async def serve(settings: Settings, lifecycle: Lifecycle) -> None:
    async with connected(settings, lifecycle.metrics) as (pool, transport):
        await run_scheduler(settings, lifecycle, pool, transport)


def main(argv: Sequence[str] | None = None) -> None:
    run(
        "keel-scheduler",
        serve,
        argv,
        description="Choose a compute host for each new instance and claim its resources.",
    )
