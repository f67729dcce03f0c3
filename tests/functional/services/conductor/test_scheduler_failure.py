"""A scheduler that claims and then does not answer in time: the build is not lost.

A timeout is a transient failure: the conductor changes nothing and its message is
delivered again. The scheduler is idempotent per instance, so the next attempt gets the
claim the first one made, and the build goes on with exactly one claim.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import asyncpg
import pytest

from services.compute.rpcapi import RPC_VERSION as COMPUTE_RPC_VERSION
from services.compute.rpcapi import ComputeAPI, topic_for
from services.conductor.manager import ConductorManager
from services.conductor.rpcapi import BuildInstances, ConductorAPI
from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import (
    RPC_VERSION,
    TOPIC,
    SchedulerAPI,
    SelectDestinations,
    Selection,
)
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instances, services
from shared.exceptions import MessagingTimeout
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.functional.services.conductor.stand_in import (
    StandInCompute,
    create_instance,
    eventually,
    resources,
)

pytestmark = pytest.mark.functional


class SlowScheduler(SchedulerManager):
    """The real scheduler, answering only after its caller stopped waiting."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool, HostManager(service_down_time=60))
        self.release = asyncio.Event()

    async def select_destinations(self, ctx: RequestContext, req: SelectDestinations) -> Selection:
        selection = await super().select_destinations(ctx, req)
        await self.release.wait()
        return selection


async def test_scheduler_timeout_is_retried_and_reuses_the_claim(
    db_pool: asyncpg.Pool, agent_transport: AmqpTransport
) -> None:
    async with db_pool.acquire() as conn:
        service = await services.get_or_create(
            conn, host="cn1", binary="keel-compute", topic="compute", version=1, down_time=60
        )
        await services.heartbeat(conn, service.uuid, 1)
        node = await compute_nodes.upsert(
            conn,
            node_uuid=uuid.uuid4(),
            service_id=service.id,
            host="cn1",
            resources=resources("n"),
        )
    slow = SlowScheduler(db_pool)
    server = RPCServer(agent_transport, TOPIC, slow, version=RPC_VERSION)
    await server.start(prefetch=4)
    agent = StandInCompute(ConductorAPI(agent_transport))
    agent.report = False
    agent_server = RPCServer(
        agent_transport, topic_for(service.uuid), agent, version=COMPUTE_RPC_VERSION
    )
    await agent_server.start(prefetch=4)
    manager = ConductorManager(
        db_pool,
        SchedulerAPI(agent_transport, timeout=0.5),
        ComputeAPI(agent_transport),
        service_down_time=60,
    )
    instance_uuid = await create_instance(db_pool)
    build = BuildInstances(instance_uuid=instance_uuid)

    with pytest.raises(MessagingTimeout):
        await manager.build_instances(RequestContext(), build)
    async with db_pool.acquire() as conn:
        waiting = await instances.get(conn, instance_uuid)
        first_claims = await allocations.for_instance(conn, instance_uuid)
    assert (waiting.vm_state, waiting.task_state) == ("building", "scheduling")
    assert [c.compute_node_id for c in first_claims] == [node.id]

    # Delivered again; this time the scheduler answers in time.
    slow.release.set()
    await manager.build_instances(RequestContext(), build)

    await eventually(lambda: _some(agent.built))
    async with db_pool.acquire() as conn:
        placed = await instances.get(conn, instance_uuid)
        claims = await allocations.for_instance(conn, instance_uuid)
        fresh = await compute_nodes.get_by_uuid(conn, node.uuid)
        drift = await allocations.usage_drift(conn)
    await server.stop(drain_timeout=5)
    assert (placed.task_state, placed.host) == ("spawning", "cn1")
    assert claims == first_claims
    assert fresh.memory_mb_used == claims[0].memory_mb
    assert drift == []


async def _some(items: Sequence[object]) -> bool | None:
    return True if items else None
