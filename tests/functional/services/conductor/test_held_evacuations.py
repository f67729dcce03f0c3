"""An evacuation of a host forced down while its fence's lease runs waits for that lease.

Real conductor and scheduler on real RabbitMQ and PostgreSQL; stand-in agents. The
source A is forced down right after a heartbeat that reported an armed fence: the
evacuation is accepted and its destination claimed, but B is asked to build only once
A's lease (plus the margin) has run out, when the conductors' sweep sends it on.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.conductor.moves.held import HeldMoves
from services.conductor.rpcapi import ConductorAPI, GuestFate
from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, instances, moves
from shared.objects.migration import EVACUATION, Migration, MigrationStatus, MigrationType
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import (
    create_instance,
    eventually,
    until_active,
)
from tests.functional.services.conductor.test_migrations import host, migration_status

pytestmark = pytest.mark.functional

LEASE = 40.0
#: The conductor's KEEL_FENCING__MARGIN (its default).
MARGIN = 30.0


async def forced_down(pool: asyncpg.Pool, name: str, *, silent: float) -> None:
    """Its last heartbeat, ``silent`` seconds ago, reported an armed fence; forced down."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET forced_down = true, fence_lease = $2,
                      last_seen_up = now() - make_interval(secs => $3)
                WHERE host = $1 AND "binary" = 'keel-compute'""",
            name,
            LEASE,
            silent,
        )


async def evacuation(pool: asyncpg.Pool, instance_uuid: UUID, source_node: UUID) -> Migration:
    """What keel-api records for ``openstack server evacuate``."""
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
        )


async def test_the_new_copy_waits_for_the_sources_lease_then_is_built_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    reg_a, _ = await host(conductor, agent_transport, "held-a")
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(db_pool, instance_uuid)
    _, agent_b = await host(conductor, agent_transport, "held-b")
    await forced_down(db_pool, "held-a", silent=1.0)
    migration = await evacuation(db_pool, instance_uuid, reg_a.node_uuid)
    ctx = RequestContext(user_id="u", project_id="p")

    await asyncio.gather(
        conductor.evacuate_instance(ctx, migration.uuid),
        conductor.evacuate_instance(ctx, migration.uuid),
    )
    held = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    await asyncio.sleep(1.0)
    async with db_pool.acquire() as conn:
        held = await moves.get(conn, migration.uuid)
        action = await conn.fetchrow(
            "SELECT message, finish_time FROM instance_actions WHERE instance_uuid = $1 "
            "AND action = 'evacuate'",
            instance_uuid,
        )
    assert held.held_until is not None
    assert agent_b.rebuilt == [], "no new copy while A's fence may let the old one run"
    assert action is not None
    assert action["finish_time"] is None
    assert "runs out only" in action["message"], action["message"]

    # The lease has run out (and the margin): two sweeps at once send it on.
    await forced_down(db_pool, "held-a", silent=LEASE + MARGIN + 1)
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE migrations SET held_until = now() - interval '1 second' WHERE uuid = $1",
            migration.uuid,
        )
    sweeps = [HeldMoves(db_pool, ConductorAPI(agent_transport, timeout=20)) for _ in range(2)]
    await asyncio.gather(*(sweep.sweep() for sweep in sweeps))

    done = await migration_status(db_pool, migration.uuid, MigrationStatus.DONE)
    assert done.held_until is None
    assert set(agent_b.rebuilt) == {instance_uuid}


async def test_a_source_whose_agent_still_renews_its_lease_holds_its_evacuation(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Forced down, but the lease is renewed (its agent lives): swept again, held again."""
    reg_a, _ = await host(conductor, agent_transport, "renew-a")
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(db_pool, instance_uuid)
    _, agent_b = await host(conductor, agent_transport, "renew-b")
    await forced_down(db_pool, "renew-a", silent=0.5)
    migration = await evacuation(db_pool, instance_uuid, reg_a.node_uuid)
    await conductor.evacuate_instance(RequestContext(), migration.uuid)
    await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)

    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE migrations SET held_until = now() - interval '1 second' WHERE uuid = $1",
            migration.uuid,
        )
    await forced_down(db_pool, "renew-a", silent=0.5)  # a heartbeat renewed it just now
    await HeldMoves(db_pool, ConductorAPI(agent_transport, timeout=20)).sweep()

    async def held_again() -> Migration | None:
        async with db_pool.acquire() as conn:
            found = await moves.get(conn, migration.uuid)
        return found if found.held_until is not None else None

    again = await eventually(held_again)
    assert again.status == MigrationStatus.PRE_MIGRATING
    assert agent_b.rebuilt == []


async def test_a_source_back_reporting_the_guest_off_releases_its_evacuation(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Forced down, its agent back and renewing the lease: its guest report (twice at
    once) shows the evacuated guest running, which holds; then shut down (the agent keeps
    an evacuating guest off), which sends the evacuation on, and it is not held again."""
    reg_a, _ = await host(conductor, agent_transport, "back-a")
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(db_pool, instance_uuid)
    _, agent_b = await host(conductor, agent_transport, "back-b")
    await forced_down(db_pool, "back-a", silent=0.5)
    migration = await evacuation(db_pool, instance_uuid, reg_a.node_uuid)
    await conductor.evacuate_instance(RequestContext(), migration.uuid)
    await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    ctx = RequestContext.internal()

    running = await conductor.report_guests(
        ctx, reg_a.node_uuid, [instance_uuid], power={instance_uuid: PowerState.RUNNING}
    )
    assert running is not None
    assert [v.fate for v in running.verdicts] == [GuestFate.EVACUATING]
    async with db_pool.acquire() as conn:
        assert (await moves.get(conn, migration.uuid)).source_off_at is None

    off = {instance_uuid: PowerState.SHUTDOWN}
    await asyncio.gather(
        *(conductor.report_guests(ctx, reg_a.node_uuid, [instance_uuid], power=off) for _ in "ab")
    )
    await forced_down(db_pool, "back-a", silent=0.5)  # its heartbeats renew the lease
    await HeldMoves(db_pool, ConductorAPI(agent_transport, timeout=20)).sweep()

    async def rebuilt_on_b() -> bool | None:
        return True if agent_b.rebuilt == [instance_uuid] else None

    await eventually(rebuilt_on_b)
    async with db_pool.acquire() as conn:
        released = await moves.get(conn, migration.uuid)
    assert released.source_off_at is not None
    assert released.held_until is None
