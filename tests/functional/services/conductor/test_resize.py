"""Resize on real RabbitMQ and PostgreSQL: a cold migration with a new flavor, each cast
twice at once.

The destination is claimed and built with the new flavor; once there the server has it;
confirm keeps it (the claim on the destination, of the new flavor, becomes the server's
own), revert gives the old one back on the source (the new flavor's claim released).
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instances, move_requests
from shared.objects.flavor import FlavorSnapshot
from shared.objects.migration import RESIZE, Migration, MigrationStatus
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import SMALL, create_instance, until_active
from tests.functional.services.conductor.test_migrations import (
    StandInMover,
    claims,
    host,
    migration_status,
    start_step,
)

pytestmark = pytest.mark.functional

LARGER = FlavorSnapshot(flavorid="2", name="larger", vcpus=2, memory_mb=1024, root_gb=2)


async def resized(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport, prefix: str
) -> tuple[Migration, StandInMover, StandInMover, int, int]:
    """A SMALL server built on A, resized to LARGER on B (cast twice at once): finished."""
    reg_a, agent_a = await host(conductor, transport, f"{prefix}-a")
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    reg_b, agent_b = await host(conductor, transport, f"{prefix}-b")
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn:
        source = await compute_nodes.get_by_uuid(conn, reg_a.node_uuid)
    migration = await move_requests.record(
        pool, ctx, RESIZE, instance_uuid=instance_uuid, source=source, flavors=(SMALL, LARGER)
    )
    assert migration is not None
    await asyncio.gather(*(conductor.resize_instance(ctx, migration.uuid) for _ in range(2)))
    finished = await migration_status(pool, migration.uuid, MigrationStatus.FINISHED)
    return finished, agent_a, agent_b, reg_a.node_id, reg_b.node_id


async def held(pool: asyncpg.Pool, instance_uuid: UUID) -> dict[int, int]:
    """Node id → the memory the server's claims hold there."""
    async with pool.acquire() as conn:
        found = await allocations.for_instance(conn, instance_uuid)
    return {a.compute_node_id: a.memory_mb for a in found}


async def test_a_resize_is_built_with_the_new_flavor_and_confirmed(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent_a, agent_b, node_a, node_b = await resized(
        db_pool, conductor, agent_transport, "rz"
    )
    instance_uuid = migration.instance_uuid
    assert (migration.migration_type, migration.old_flavor, migration.new_flavor) == (
        "resize",
        SMALL,
        LARGER,
    )
    assert set(agent_a.prepared) == {instance_uuid}
    assert set(agent_b.rebuilt) == {instance_uuid}
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.compute_id, instance.flavor) == (
        VmState.RESIZED,
        node_b,
        LARGER,
    )
    assert await held(db_pool, instance_uuid) == {node_a: 512, node_b: 1024}

    await start_step(db_pool, migration, TaskState.RESIZE_CONFIRMING, MigrationStatus.CONFIRMING)
    ctx = RequestContext()
    await asyncio.gather(*(conductor.confirm_migration(ctx, migration.uuid) for _ in range(2)))
    await migration_status(db_pool, migration.uuid, MigrationStatus.CONFIRMED)

    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.flavor) == (
        VmState.ACTIVE,
        None,
        LARGER,
    )
    assert await claims(db_pool, instance_uuid) == {("instance", node_b)}
    assert await held(db_pool, instance_uuid) == {node_b: 1024}


async def test_a_reverted_resize_gets_its_old_flavor_back_on_its_source(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent_a, agent_b, node_a, _ = await resized(
        db_pool, conductor, agent_transport, "rzr"
    )
    instance_uuid = migration.instance_uuid

    await start_step(db_pool, migration, TaskState.RESIZE_REVERTING, MigrationStatus.REVERTING)
    ctx = RequestContext()
    await asyncio.gather(*(conductor.revert_migration(ctx, migration.uuid) for _ in range(2)))
    await migration_status(db_pool, migration.uuid, MigrationStatus.REVERTED)

    assert set(agent_b.removed) == {instance_uuid}
    assert agent_a.removed == []
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.compute_id, instance.flavor) == (
        VmState.ACTIVE,
        node_a,
        SMALL,
    )
    assert await held(db_pool, instance_uuid) == {node_a: 512}
