"""keel-conductor: the composition root.

Connects to PostgreSQL and RabbitMQ, registers this conductor's own service row
(binary ``keel-conductor``; two conductors on one host share it), heartbeats it in the
database every report interval, and serves the conductor RPC API on the ``conductor``
topic as one of possibly many competing consumers, with scheduler and compute clients
on the same transport. It also runs the deadline sweep (:mod:`services.conductor.deadlines`):
builds, moves and tasks that overran their deadlines, cold migrations left unconfirmed
or stalled while confirming or reverting; and the automatic evacuation of fenced hosts
(:mod:`services.conductor.recovery`, when ``KEEL_RECOVERY__AUTO_EVACUATE`` asks for it),
and the running host tasks, drains and evacuations of whole hosts
(:mod:`services.conductor.host_tasks`).
On SIGTERM it stops consuming, lets work in flight finish (bounded), then closes the
transport and the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.agent_authorisation import AgentGuard
from services.conductor.boot_images import BootImages
from services.conductor.deadlines import Deadlines
from services.conductor.host_tasks.sweep import HostTasks
from services.conductor.manager import ConductorManager
from services.conductor.moves.held import HELD_INTERVAL, HeldMoves
from services.conductor.recovery import Recovery
from services.conductor.rpcapi import TOPIC, ConductorAPI
from services.scheduler.rpcapi import SchedulerAPI
from shared.config import Settings
from shared.faults import FaultPoints
from shared.objects.service import Binary
from shared.rpc.server import RPCServer
from shared.rpc.settlement import RetryPolicy
from shared.rpc.transport import Transport
from shared.runtime import Lifecycle, run
from shared.service_record import Periodic, ServiceRecord, connected, serve_until_stopped
from shared.version_pins import Pins
from shared.versions import apis_for


async def run_conductor(
    settings: Settings, lifecycle: Lifecycle, pool: asyncpg.Pool, transport: Transport
) -> None:
    """Serve until ``lifecycle.stopping`` is set, then drain."""
    pins = Pins.build(pool, settings, lifecycle.metrics)
    record = ServiceRecord(
        pool, settings, binary=Binary.CONDUCTOR, topic=TOPIC, minimums=pins.minimums
    )
    timeout = settings.rpc.call_timeout
    compute = ComputeAPI(transport, timeout=timeout, version_cap=pins.compute.cap)
    manager = ConductorManager(
        pool,
        SchedulerAPI(transport, timeout=timeout, version_cap=pins.scheduler.cap),
        compute,
        service_down_time=settings.service_down_time,
        faults=FaultPoints(settings.fault_inject),
        boot_images=BootImages.from_settings(settings),
        minimums=pins.minimums,
        same_host_resize=settings.allow_resize_to_same_host,
        fence_margin=settings.fencing.margin,
        metrics=lifecycle.metrics,
        shelved_offload_time=settings.shelved_offload_time,
    )
    server = RPCServer(
        transport,
        TOPIC,
        manager,
        version=apis_for(settings.service_version).conductor,
        policy=RetryPolicy.from_settings(settings.rpc),
        metrics=lifecycle.metrics,
        guard=AgentGuard(pool),
    )
    lifecycle.on_reload(pins.reload)
    deadlines = Deadlines(pool, compute, settings)
    held = HeldMoves(pool, ConductorAPI(transport, timeout=timeout))
    recovery = Recovery(pool, ConductorAPI(transport, timeout=timeout), settings, lifecycle.metrics)
    host_tasks = HostTasks(
        pool,
        ConductorAPI(transport, timeout=timeout, version_cap=pins.conductor.cap),
        compute,
        settings,
    )
    periodic = [
        Periodic("deadlines", deadlines.sweep, deadlines.interval),
        Periodic("held evacuations", held.sweep, HELD_INTERVAL),
        Periodic("recovery", recovery.sweep, recovery.interval),
        Periodic("host tasks", host_tasks.sweep, host_tasks.interval),
    ]
    # A build waits at most one scheduler call; give it that long, and a little more.
    await serve_until_stopped(
        record, server, lifecycle, drain_timeout=timeout + 5.0, periodic=periodic
    )


async def serve(settings: Settings, lifecycle: Lifecycle) -> None:
    async with connected(settings, lifecycle.metrics) as (pool, transport):
        await run_conductor(settings, lifecycle, pool, transport)


def main(argv: Sequence[str] | None = None) -> None:
    run(
        "keel-conductor",
        serve,
        argv,
        description="Run keel's workflows and be the compute agents' path to the database.",
    )
