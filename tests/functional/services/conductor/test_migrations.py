"""Cold migration on real RabbitMQ and PostgreSQL, every step delivered twice at once.

Two stand-in agents, A and B. The API's part (recording the migration, moving the
record to ``confirming`` or ``reverting``) is done here in SQL; the conductor's casts are
published twice concurrently. Each case must end as if delivered once: one record
status, the claims on the right nodes, usage equal to allocations on every node.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import (
    ComputeAPI,
    FinishRevert,
    GuestDisk,
    PreparedMigration,
    PrepareMigration,
    RebuildInstance,
    RemoveMovedGuest,
)
from services.conductor.moves.sweep import MigrationSweep
from services.conductor.rpcapi import ConductorAPI, Registration
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, moves
from shared.objects.migration import Migration, MigrationStatus, MigrationType
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.conftest import SOON
from tests.functional.services.conductor.stand_in import (
    StandInCompute,
    create_instance,
    eventually,
    register,
    serve_stand_in,
    until,
    until_active,
)

pytestmark = pytest.mark.functional


class StandInMover(StandInCompute):
    """A stand-in agent that also takes part in moves, recording what it was asked."""

    def __init__(self, conductor: ConductorAPI) -> None:
        super().__init__(conductor)
        self.rebuilt: list[UUID] = []
        self.prepared: list[UUID] = []
        self.removed: list[UUID] = []
        self.reverted: list[FinishRevert] = []
        #: The source disk each rebuild carried.
        self.source_disks: list[GuestDisk | None] = []
        #: Whether each rebuild asked for the guest powered off.
        self.powered_off: list[bool] = []
        #: When set, rebuilds report this failure.
        self.rebuild_fails: str | None = None

    async def rebuild_instance(self, ctx: RequestContext, req: RebuildInstance) -> None:
        self.rebuilt.append(req.instance.uuid)
        self.source_disks.append(req.source_disk)
        self.powered_off.append(req.powered_off)
        await self.conductor.move_result(
            ctx,
            req.migration_uuid,
            success=self.rebuild_fails is None,
            message=self.rebuild_fails or "",
        )

    async def prepare_migration(
        self, ctx: RequestContext, req: PrepareMigration
    ) -> PreparedMigration:
        self.prepared.append(req.instance_uuid)
        return PreparedMigration(disk=disk_of(req.instance_uuid))

    async def remove_moved_guest(self, ctx: RequestContext, req: RemoveMovedGuest) -> None:
        self.removed.append(req.instance_uuid)

    async def finish_revert(self, ctx: RequestContext, req: FinishRevert) -> None:
        self.reverted.append(req)


def disk_of(instance_uuid: UUID) -> GuestDisk:
    """Where a stand-in source says the guest's disk is."""
    return GuestDisk(machine="mig-a.example", path=f"/var/lib/keel/instances/{instance_uuid}/disk")


async def host(
    conductor: ConductorAPI, transport: AmqpTransport, name: str
) -> tuple[Registration, StandInMover]:
    registration = await register(conductor, name)
    agent = StandInMover(conductor)
    await serve_stand_in(transport, registration, agent)
    return registration, agent


async def migration_status(pool: asyncpg.Pool, migration_uuid: UUID, status: str) -> Migration:
    async def check() -> Migration | None:
        async with pool.acquire() as conn:
            found = await moves.get(conn, migration_uuid)
        return found if found.status == status else None

    return await eventually(check)


async def claims(pool: asyncpg.Pool, instance_uuid: UUID) -> set[tuple[str, int]]:
    """(holder, node id) of every claim serving the instance; usage must add up."""
    async with pool.acquire() as conn:
        held = await allocations.for_instance(conn, instance_uuid)
        assert await allocations.usage_drift(conn) == []
    return {
        ("instance" if a.consumer_uuid == instance_uuid else "migration", a.compute_node_id)
        for a in held
    }


async def migrated(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport
) -> tuple[Migration, StandInMover, StandInMover, int, int]:
    """An instance built on A, then migrated to B (each cast twice at once): ``finished``."""
    reg_a, agent_a = await host(conductor, transport, "mig-a")
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    reg_b, agent_b = await host(conductor, transport, "mig-b")
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        source = await compute_nodes.get_by_uuid(conn, reg_a.node_uuid)
        await instances.begin_task(
            conn, instance_uuid, TaskState.RESIZE_PREP, vm_states=(VmState.ACTIVE,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, "migrate")
        migration = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=MigrationType.MIGRATION,
            status=MigrationStatus.ACCEPTED,
            source=source,
        )
    await asyncio.gather(
        conductor.migrate_instance(ctx, migration.uuid),
        conductor.migrate_instance(ctx, migration.uuid),
    )
    finished = await migration_status(pool, migration.uuid, MigrationStatus.FINISHED)
    return finished, agent_a, agent_b, reg_a.node_id, reg_b.node_id


async def start_step(
    pool: asyncpg.Pool, migration: Migration, task: TaskState, status: str
) -> None:
    """What keel-api records for confirmResize or revertResize."""
    async with pool.acquire() as conn, conn.transaction():
        assert await instances.begin_task(
            conn, migration.instance_uuid, task, vm_states=(VmState.RESIZED,)
        )
        assert await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.FINISHED], new=status
        )


async def test_migrate_and_confirm_delivered_twice_at_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent_a, agent_b, node_a, node_b = await migrated(
        db_pool, conductor, agent_transport
    )
    instance_uuid = migration.instance_uuid
    assert migration.dest_compute_id == node_b
    assert set(agent_a.prepared) == {instance_uuid}
    assert set(agent_b.rebuilt) == {instance_uuid}
    assert agent_b.source_disks == [disk_of(instance_uuid)] * len(agent_b.rebuilt)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.RESIZED,
        None,
        node_b,
    )
    assert await claims(db_pool, instance_uuid) == {("instance", node_a), ("migration", node_b)}

    await start_step(db_pool, migration, TaskState.RESIZE_CONFIRMING, MigrationStatus.CONFIRMING)
    ctx = RequestContext()
    await asyncio.gather(
        conductor.confirm_migration(ctx, migration.uuid),
        conductor.confirm_migration(ctx, migration.uuid),
    )
    await migration_status(db_pool, migration.uuid, MigrationStatus.CONFIRMED)
    await until(lambda: bool(agent_a.removed))
    assert set(agent_a.removed) == {instance_uuid}
    assert agent_b.removed == []
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        node_b,
    )
    assert await claims(db_pool, instance_uuid) == {("instance", node_b)}


async def test_revert_delivered_twice_at_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent_a, agent_b, node_a, _ = await migrated(db_pool, conductor, agent_transport)
    instance_uuid = migration.instance_uuid

    await start_step(db_pool, migration, TaskState.RESIZE_REVERTING, MigrationStatus.REVERTING)
    ctx = RequestContext()
    await asyncio.gather(
        conductor.revert_migration(ctx, migration.uuid),
        conductor.revert_migration(ctx, migration.uuid),
    )
    await migration_status(db_pool, migration.uuid, MigrationStatus.REVERTED)
    assert set(agent_b.removed) == {instance_uuid}
    assert agent_a.removed == []
    assert agent_a.reverted
    assert all(req.power_on for req in agent_a.reverted)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        node_a,
    )
    assert await claims(db_pool, instance_uuid) == {("instance", node_a)}


async def test_copy_removed_reported_twice_at_once_confirms_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """The source's agent was away when the confirm came; it removed its copy on return."""
    migration, _, _, node_a, node_b = await migrated(db_pool, conductor, agent_transport)
    await start_step(db_pool, migration, TaskState.RESIZE_CONFIRMING, MigrationStatus.CONFIRMING)
    async with db_pool.acquire() as conn:
        source = await compute_nodes.get_by_id(conn, node_a)
    ctx = RequestContext()
    await asyncio.gather(
        conductor.copy_removed(ctx, migration.uuid, source.uuid),
        conductor.copy_removed(ctx, migration.uuid, source.uuid),
    )
    await migration_status(db_pool, migration.uuid, MigrationStatus.CONFIRMED)
    assert await claims(db_pool, migration.instance_uuid) == {("instance", node_b)}


async def test_failed_rebuild_reported_twice_at_once_fails_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    reg_a, _ = await host(conductor, agent_transport, "fail-a")
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(db_pool, instance_uuid)
    _, agent_b = await host(conductor, agent_transport, "fail-b")
    agent_b.rebuild_fails = "disk full"
    ctx = RequestContext(user_id="u", project_id="p")
    async with db_pool.acquire() as conn, conn.transaction():
        source = await compute_nodes.get_by_uuid(conn, reg_a.node_uuid)
        await instances.begin_task(
            conn, instance_uuid, TaskState.RESIZE_PREP, vm_states=(VmState.ACTIVE,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, "migrate")
        migration = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=MigrationType.MIGRATION,
            status=MigrationStatus.ACCEPTED,
            source=source,
        )
    await conductor.migrate_instance(ctx, migration.uuid)
    await until(lambda: bool(agent_b.rebuilt))
    await asyncio.gather(
        conductor.move_result(ctx, migration.uuid, success=False, message="disk full"),
        conductor.move_result(ctx, migration.uuid, success=False, message="disk full"),
    )
    await migration_status(db_pool, migration.uuid, MigrationStatus.FAILED)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        finished = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'migrate' AND finish_time IS NOT NULL""",
            instance_uuid,
        )
    assert (instance.vm_state, instance.compute_id) == (VmState.ERROR, source.id)
    assert await claims(db_pool, instance_uuid) == {("instance", source.id)}
    assert finished == 1


async def aged(pool: asyncpg.Pool, migration: Migration) -> None:
    """Make the record look as if it has not changed for an hour."""
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE migrations SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            migration.uuid,
        )


def sweeper(
    pool: asyncpg.Pool, transport: AmqpTransport, *, window: float, stall_after: float = 3600
) -> MigrationSweep:
    return MigrationSweep(
        pool,
        ComputeAPI(transport, timeout=SOON),
        confirm_window=window,
        stall_after=stall_after,
        down_time=60,
    )


async def test_two_sweeps_at_once_auto_confirm_a_migration_past_its_window_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent_a, agent_b, _, node_b = await migrated(db_pool, conductor, agent_transport)
    await aged(db_pool, migration)
    sweeps = [sweeper(db_pool, agent_transport, window=60) for _ in range(2)]
    worked = await asyncio.gather(*(sweep.sweep() for sweep in sweeps))
    assert sorted(worked) == [0, 1]
    await migration_status(db_pool, migration.uuid, MigrationStatus.CONFIRMED)
    assert agent_a.removed == [migration.instance_uuid]
    assert agent_b.removed == []
    assert await claims(db_pool, migration.instance_uuid) == {("instance", node_b)}
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, migration.instance_uuid)
        actions = await conn.fetch(
            "SELECT action FROM instance_actions WHERE instance_uuid = $1 AND action = $2",
            migration.instance_uuid,
            "confirmResize",
        )
    assert (instance.vm_state, instance.task_state) == (VmState.ACTIVE, None)
    assert len(actions) == 1


async def test_no_window_or_a_recent_migration_is_left_for_its_owner(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    migration, agent_a, _, node_a, node_b = await migrated(db_pool, conductor, agent_transport)
    assert await sweeper(db_pool, agent_transport, window=3600).sweep() == 0
    await aged(db_pool, migration)
    assert await sweeper(db_pool, agent_transport, window=0).sweep() == 0
    async with db_pool.acquire() as conn:
        found = await moves.get(conn, migration.uuid)
    assert found.status == MigrationStatus.FINISHED
    assert agent_a.removed == []
    assert await claims(db_pool, migration.instance_uuid) == {
        ("instance", node_a),
        ("migration", node_b),
    }


@pytest.mark.parametrize(
    "step",
    [
        (TaskState.RESIZE_CONFIRMING, MigrationStatus.CONFIRMING, MigrationStatus.CONFIRMED),
        (TaskState.RESIZE_REVERTING, MigrationStatus.REVERTING, MigrationStatus.REVERTED),
    ],
)
async def test_a_stalled_confirm_or_revert_is_driven_on_once_by_two_sweeps(
    db_pool: asyncpg.Pool,
    conductor: ConductorAPI,
    agent_transport: AmqpTransport,
    step: tuple[TaskState, str, str],
) -> None:
    """keel-api recorded the step but its message never reached a conductor."""
    task, status, ended = step
    migration, agent_a, agent_b, node_a, node_b = await migrated(
        db_pool, conductor, agent_transport
    )
    await start_step(db_pool, migration, task, status)
    await aged(db_pool, migration)
    sweeps = [sweeper(db_pool, agent_transport, window=0, stall_after=60) for _ in range(2)]
    await asyncio.gather(*(sweep.sweep() for sweep in sweeps))
    await migration_status(db_pool, migration.uuid, ended)
    confirmed = ended == MigrationStatus.CONFIRMED
    removed_by = agent_a if confirmed else agent_b
    assert set(removed_by.removed) == {migration.instance_uuid}
    home = node_b if confirmed else node_a
    assert await claims(db_pool, migration.instance_uuid) == {("instance", home)}
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, migration.instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        home,
    )
