"""An evacuation asked for at compute microversion 2.95 ends with the server stopped.

Real conductor and scheduler on real RabbitMQ and PostgreSQL; stand-in agents. A running
server's host is fenced (forced down, its lease long run out) and the server evacuated:
recorded ``end_stopped`` (as keel-api records it from 2.95), the new copy is built
powered off and the server ends SHUTOFF; recorded without it, it runs again as before.
The evacuation is delivered twice at once, as a redelivery may.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, instances, moves
from shared.objects.migration import EVACUATION, Migration, MigrationStatus, MigrationType
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import create_instance, until_active
from tests.functional.services.conductor.test_held_evacuations import LEASE, MARGIN, forced_down
from tests.functional.services.conductor.test_migrations import host, migration_status

pytestmark = pytest.mark.functional


async def evacuation(
    pool: asyncpg.Pool, instance_uuid: UUID, source_node: UUID, *, end_stopped: bool
) -> Migration:
    """What keel-api records for ``openstack server evacuate`` (at 2.95 or later when
    ``end_stopped``)."""
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        source = await compute_nodes.get_by_uuid(conn, source_node)
        await instances.begin_task(
            conn, instance_uuid, TaskState.REBUILDING, vm_states=(VmState.ACTIVE,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, EVACUATION.action)
        return await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=MigrationType.EVACUATION,
            status=MigrationStatus.ACCEPTED,
            source=source,
            end_stopped=end_stopped,
        )


@pytest.mark.parametrize(
    ("end_stopped", "vm_state", "power_state"),
    [(True, VmState.STOPPED, PowerState.SHUTDOWN), (False, VmState.ACTIVE, PowerState.RUNNING)],
)
async def test_an_evacuation_recorded_end_stopped_ends_with_the_server_stopped(
    db_pool: asyncpg.Pool,
    conductor: ConductorAPI,
    agent_transport: AmqpTransport,
    *,
    end_stopped: bool,
    vm_state: VmState,
    power_state: PowerState,
) -> None:
    name = f"stop-{str(end_stopped).lower()}"
    reg_a, _ = await host(conductor, agent_transport, f"{name}-a")
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(db_pool, instance_uuid)
    _, agent_b = await host(conductor, agent_transport, f"{name}-b")
    await forced_down(db_pool, f"{name}-a", silent=LEASE + MARGIN + 1)
    migration = await evacuation(db_pool, instance_uuid, reg_a.node_uuid, end_stopped=end_stopped)
    ctx = RequestContext(user_id="u", project_id="p")

    await asyncio.gather(
        conductor.evacuate_instance(ctx, migration.uuid),
        conductor.evacuate_instance(ctx, migration.uuid),
    )

    await migration_status(db_pool, migration.uuid, MigrationStatus.DONE)
    async with db_pool.acquire() as conn:
        evacuated = await instances.get(conn, instance_uuid)
    # Both deliveries may ask B to build (its agent builds one copy): each asks alike.
    assert set(agent_b.rebuilt) == {instance_uuid}
    assert set(agent_b.powered_off) == {end_stopped}
    assert (evacuated.vm_state, evacuated.power_state) == (vm_state, power_state)
    assert evacuated.task_state is None
