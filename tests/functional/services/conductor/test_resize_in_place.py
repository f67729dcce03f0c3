"""A resize on the server's own host (KEEL_ALLOW_RESIZE_TO_SAME_HOST): one copy, resized in
place, never removed; each cast twice at once.

There is one host, so the scheduler can only pick the server's own. Its stand-in agent
records what it is asked: never to remove the copy.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from services.compute.rpcapi import FinishRevert, RebuildInstance
from services.conductor.rpcapi import ConductorAPI
from shared.config import RpcSettings, Settings
from shared.context import RequestContext
from shared.db import compute_nodes, instances, move_requests
from shared.objects.migration import RESIZE, Migration, MigrationStatus
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import (
    SMALL,
    create_instance,
    register,
    serve_stand_in,
    until_active,
)
from tests.functional.services.conductor.test_migrations import (
    StandInMover,
    migration_status,
    start_step,
)
from tests.functional.services.conductor.test_resize import LARGER, held

pytestmark = pytest.mark.functional


@pytest.fixture
def settings(database_url: str, amqp_url: str, exchange: str) -> Settings:
    return Settings(
        database_url=database_url,
        transport_url=amqp_url,
        exchange=exchange,
        host="control-host",
        report_interval=0.5,
        rpc=RpcSettings(queue_expires=60, call_timeout=10, connect_timeout=10),
        allow_resize_to_same_host=True,
    )


class InPlace(StandInMover):
    """Records in-place resizes and reverts; reports them done."""

    def __init__(self, conductor: ConductorAPI) -> None:
        super().__init__(conductor)
        self.in_place: list[RebuildInstance] = []

    async def rebuild_instance(self, ctx: RequestContext, req: RebuildInstance) -> None:
        if req.in_place:
            self.in_place.append(req)
        await super().rebuild_instance(ctx, req)

    async def finish_revert(self, ctx: RequestContext, req: FinishRevert) -> None:
        self.reverted.append(req)


async def resized_in_place(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport, name: str
) -> tuple[Migration, InPlace, int]:
    own = await register(conductor, name)
    agent = InPlace(conductor)
    await serve_stand_in(transport, own, agent)
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn:
        source = await compute_nodes.get_by_uuid(conn, own.node_uuid)
    migration = await move_requests.record(
        pool, ctx, RESIZE, instance_uuid=instance_uuid, source=source, flavors=(SMALL, LARGER)
    )
    assert migration is not None
    await asyncio.gather(*(conductor.resize_instance(ctx, migration.uuid) for _ in range(2)))
    finished = await migration_status(pool, migration.uuid, MigrationStatus.FINISHED)
    return finished, agent, own.node_id


async def test_a_resize_on_its_own_host_is_made_in_place_and_confirmed(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent, node = await resized_in_place(db_pool, conductor, agent_transport, "rip")
    instance_uuid = migration.instance_uuid
    assert migration.in_place
    assert agent.in_place
    assert all(r.instance.flavor == LARGER for r in agent.in_place)
    assert agent.rebuilt == [instance_uuid] * len(agent.rebuilt)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.compute_id, instance.flavor) == (
        VmState.RESIZED,
        node,
        LARGER,
    )

    await start_step(db_pool, migration, TaskState.RESIZE_CONFIRMING, MigrationStatus.CONFIRMING)
    ctx = RequestContext()
    await asyncio.gather(*(conductor.confirm_migration(ctx, migration.uuid) for _ in range(2)))
    await migration_status(db_pool, migration.uuid, MigrationStatus.CONFIRMED)

    assert agent.removed == []
    assert await held(db_pool, instance_uuid) == {node: 1024}


async def test_a_resize_on_its_own_host_is_reverted_in_place(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent, node = await resized_in_place(db_pool, conductor, agent_transport, "ripr")
    instance_uuid = migration.instance_uuid

    await start_step(db_pool, migration, TaskState.RESIZE_REVERTING, MigrationStatus.REVERTING)
    ctx = RequestContext()
    await asyncio.gather(*(conductor.revert_migration(ctx, migration.uuid) for _ in range(2)))
    await migration_status(db_pool, migration.uuid, MigrationStatus.REVERTED)

    assert agent.removed == []
    assert agent.reverted
    assert all(r.flavor == SMALL for r in agent.reverted)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.compute_id, instance.flavor) == (
        VmState.ACTIVE,
        node,
        SMALL,
    )
    assert await held(db_pool, instance_uuid) == {node: 512}
