"""A scheduler that claims and then never answers: the build ends in ERROR, claim released."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from services.compute.rpcapi import ComputeAPI
from services.conductor.manager import ConductorManager
from services.conductor.rpcapi import BuildInstances
from services.scheduler.rpcapi import (
    RPC_VERSION,
    TOPIC,
    SchedulerAPI,
    SelectDestinations,
    Selection,
)
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instances, services
from shared.exceptions import NoValidHost
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.functional.services.conductor.stand_in import create_instance, resources

pytestmark = pytest.mark.functional


class StuckScheduler:
    """Claims on the only node, then waits past the caller's timeout."""

    def __init__(self, pool: asyncpg.Pool, node_id: int) -> None:
        self.pool = pool
        self.node_id = node_id
        self.release = asyncio.Event()

    async def select_destinations(self, ctx: RequestContext, req: SelectDestinations) -> Selection:
        async with self.pool.acquire() as conn:
            assert await allocations.claim(
                conn, self.node_id, req.spec.instance_uuid, req.spec.flavor
            )
        await self.release.wait()
        raise NoValidHost("the conductor stopped waiting long ago")


async def test_scheduler_timeout_ends_in_error_and_releases_the_claim(
    db_pool: asyncpg.Pool, agent_transport: AmqpTransport
) -> None:
    async with db_pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host="cn1", binary="keel-compute", topic="compute", version=1, down_time=60
        )
        node = await compute_nodes.upsert(
            conn,
            node_uuid=uuid.uuid4(),
            service_id=service.id,
            host="cn1",
            resources=resources("n"),
        )
    stuck = StuckScheduler(db_pool, node.id)
    server = RPCServer(agent_transport, TOPIC, stuck, version=RPC_VERSION)
    await server.start(prefetch=4)
    manager = ConductorManager(
        db_pool,
        SchedulerAPI(agent_transport, timeout=0.5),
        ComputeAPI(agent_transport),
        service_down_time=60,
    )
    instance_uuid = await create_instance(db_pool)
    try:
        await manager.build_instances(RequestContext(), BuildInstances(instance_uuid=instance_uuid))
    finally:
        stuck.release.set()
        await server.stop(drain_timeout=5)

    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        held = await allocations.for_instance(conn, instance_uuid)
        fresh = await compute_nodes.get_by_uuid(conn, node.uuid)
    assert instance.vm_state == "error"
    assert instance.fault is not None
    assert instance.fault.message.startswith("Failed to schedule the instance: no reply from")
    assert held == []
    assert fresh.memory_mb_used == 0
