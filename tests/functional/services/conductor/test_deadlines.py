"""Every state has a deadline, and delete wins: real RabbitMQ and PostgreSQL.

Stand-in agents take part in moves as in ``test_migrations.py``; a destination that never
answers stands for an agent SIGKILLed mid-move. Sweeps run twice at once, as two
conductors would run them.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import ComputeAPI, RebuildInstance, StopInstance
from services.conductor.builds.deadline import BuildDeadline
from services.conductor.deadlines import Deadlines, TaskDeadline
from services.conductor.moves import arrival
from services.conductor.moves.deadline import MoveDeadline
from services.conductor.moves.task import MoveTask
from services.conductor.rpcapi import BuildVerdict, ConductorAPI, GuestFate, MoveResult
from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared.config import Settings
from shared.context import RequestContext
from shared.db import (
    allocations,
    compute_nodes,
    instance_actions,
    instances,
    moves,
    service_maintenance,
    services,
)
from shared.objects.instance import Instance
from shared.objects.migration import EVACUATION, MIGRATION, Migration, MigrationStatus, MoveKind
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from shared.rpc.fake import FakeTransport
from tests.functional.services.conductor.conftest import SOON
from tests.functional.services.conductor.stand_in import (
    create_instance,
    eventually,
    register,
    serve_stand_in,
    until,
    until_active,
)
from tests.functional.services.conductor.test_migrations import (
    StandInMover,
    aged,
    claims,
    host,
    migration_status,
)

pytestmark = pytest.mark.functional


class Silent(StandInMover):
    """A destination that takes the rebuild and never answers (killed mid-move)."""

    def __init__(self, conductor: ConductorAPI) -> None:
        super().__init__(conductor)
        self.stopped: list[UUID] = []

    async def rebuild_instance(self, ctx: RequestContext, req: RebuildInstance) -> None:
        self.rebuilt.append(req.instance.uuid)

    async def stop_instance(self, ctx: RequestContext, req: StopInstance) -> None:
        self.stopped.append(req.instance_uuid)


async def silent_host(
    conductor: ConductorAPI, transport: AmqpTransport, name: str
) -> tuple[int, Silent]:
    registration = await register(conductor, name)
    agent = Silent(conductor)
    await serve_stand_in(transport, registration, agent)
    return registration.node_id, agent


async def placed_on_a(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport, prefix: str
) -> tuple[UUID, int, StandInMover]:
    reg_a, agent_a = await host(conductor, transport, f"{prefix}-a")
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    return instance_uuid, reg_a.node_id, agent_a


async def start_move(
    pool: asyncpg.Pool, conductor: ConductorAPI, kind: MoveKind, instance_uuid: UUID, node: int
) -> Migration:
    """Record a move as keel-api does, then cast it."""
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        source = await compute_nodes.get_by_id(conn, node)
        assert await instances.begin_task(
            conn, instance_uuid, kind.choosing, vm_states=kind.movable
        )
        await instance_actions.start(conn, ctx, instance_uuid, kind.action)
        migration = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=kind.migration_type,
            status=MigrationStatus.ACCEPTED,
            source=source,
        )
    cast = conductor.evacuate_instance if kind is EVACUATION else conductor.migrate_instance
    await cast(ctx, migration.uuid)
    return migration


async def force_down(pool: asyncpg.Pool, node_id: int) -> None:
    """The node's host is dead: forced down, no heartbeat for an hour."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET forced_down = true,
                                   last_seen_up = now() - interval '1 hour',
                                   registered_at = now() - interval '1 hour'
                WHERE id = (SELECT service_id FROM compute_nodes WHERE id = $1)""",
            node_id,
        )


async def silenced(pool: asyncpg.Pool, node_id: int) -> None:
    """The node's agent died an hour ago; its host may run on (not forced down)."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET last_seen_up = now() - interval '1 hour'
                WHERE id = (SELECT service_id FROM compute_nodes WHERE id = $1)""",
            node_id,
        )


def move_deadline(pool: asyncpg.Pool, transport: AmqpTransport) -> MoveDeadline:
    return MoveDeadline(pool, ComputeAPI(transport, timeout=SOON), timeout=60, down_time=60)


async def ended_by_two_sweeps(
    pool: asyncpg.Pool, transport: AmqpTransport, migration: Migration
) -> tuple[Instance, str | None]:
    """Two sweeps at once (two conductors) end the overdue cold migration exactly once;
    the server then, and what its ``migrate`` action says."""
    ended = await asyncio.gather(*(move_deadline(pool, transport).sweep() for _ in range(2)))
    assert sorted(ended) == [0, 1]
    await migration_status(pool, migration.uuid, MigrationStatus.ERROR)
    async with pool.acquire() as conn:
        instance = await instances.get(conn, migration.instance_uuid)
        message: str | None = await conn.fetchval(
            "SELECT message FROM instance_actions WHERE instance_uuid = $1 AND action = 'migrate'",
            migration.instance_uuid,
        )
    return instance, message


async def test_a_cold_migration_whose_destination_died_goes_back_to_its_source(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, node_a, agent_a = await placed_on_a(
        db_pool, conductor, agent_transport, "dl-mig"
    )
    node_b, _ = await silent_host(conductor, agent_transport, "dl-mig-b")
    migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
    await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    # The destination "dies": its rebuild is never answered.
    assert await claims(db_pool, instance_uuid) == {
        ("instance", node_a),
        ("migration", node_b),
    }
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    await aged(db_pool, pending)

    instance, message = await ended_by_two_sweeps(db_pool, agent_transport, migration)

    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        node_a,
    )
    assert await claims(db_pool, instance_uuid) == {("instance", node_a)}
    assert message is not None
    assert "KEEL_MOVE_TIMEOUT" in message
    # The source's guest (shut down for the move) is started again.
    await until(lambda: any(r.power_on for r in agent_a.reverted))


async def test_a_cold_migration_whose_server_moved_on_leaves_it_as_it_is(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 38: while the migration waited, an admin reset its server and the server
    was evacuated to another host. The migration, timed out, must neither start a guest
    on its source nor put the server, ACTIVE elsewhere, in ERROR."""
    instance_uuid, node_a, agent_a = await placed_on_a(db_pool, conductor, agent_transport, "dl-on")
    node_b, _ = await silent_host(conductor, agent_transport, "dl-on-b")
    migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    assert pending.dest_compute_id == node_b
    registration_c, _ = await host(conductor, agent_transport, "dl-on-c")
    async with db_pool.acquire() as conn:
        # The reset, then the evacuation's end: the server ACTIVE on C with no task.
        await conn.execute(
            """UPDATE instances SET task_state = NULL, vm_state = 'active', compute_id = $2,
                                    host = 'dl-on-c', node = 'dl-on-c'
                WHERE uuid = $1""",
            instance_uuid,
            registration_c.node_id,
        )
    await aged(db_pool, pending)

    instance, message = await ended_by_two_sweeps(db_pool, agent_transport, migration)

    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        registration_c.node_id,
    )
    assert instance.fault is None
    assert message is not None
    await asyncio.sleep(0.5)  # a power-on cast to A would have reached its stand-in by now
    assert not any(r.power_on for r in agent_a.reverted)


async def test_an_evacuation_whose_destination_died_ends_in_error(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "dl-ev")
    node_b, _ = await silent_host(conductor, agent_transport, "dl-ev-b")
    await force_down(db_pool, node_a)
    migration = await start_move(db_pool, conductor, EVACUATION, instance_uuid, node_a)
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    assert ("migration", node_b) in await claims(db_pool, instance_uuid)
    await aged(db_pool, pending)

    await asyncio.gather(*(move_deadline(db_pool, agent_transport).sweep() for _ in range(2)))

    await migration_status(db_pool, migration.uuid, MigrationStatus.ERROR)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ERROR,
        None,
        node_a,
    )
    assert instance.fault is not None
    assert "did not finish" in instance.fault.message
    assert await claims(db_pool, instance_uuid) == {("instance", node_a)}


async def test_a_cold_migration_whose_destination_may_run_the_copy_stays_shut_off(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 14: the destination built the copy, then its agent died but its host may
    run on. Starting the source's guest again would run two copies: it stays shut off."""
    instance_uuid, node_a, agent_a = await placed_on_a(
        db_pool, conductor, agent_transport, "dl-stray"
    )
    node_b, agent_b = await silent_host(conductor, agent_transport, "dl-stray-b")
    migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    await until(lambda: instance_uuid in agent_b.rebuilt)
    await silenced(db_pool, node_b)
    await aged(db_pool, pending)

    instance, message = await ended_by_two_sweeps(db_pool, agent_transport, migration)

    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.STOPPED,
        None,
        node_a,
    )
    assert instance.power_state == PowerState.SHUTDOWN
    assert message is not None
    assert "dl-stray-b is down but not forced down" in message
    assert await claims(db_pool, instance_uuid) == {("instance", node_a)}
    # Nothing started the source's guest, and nothing was asked of the dead destination.
    await asyncio.sleep(0.5)
    assert agent_a.reverted == []
    assert agent_b.removed == []


async def test_an_evacuation_past_its_deadline_asks_its_destination_to_stop_the_copy(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "dl-evs")
    _, agent_b = await silent_host(conductor, agent_transport, "dl-evs-b")
    await force_down(db_pool, node_a)
    migration = await start_move(db_pool, conductor, EVACUATION, instance_uuid, node_a)
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    await until(lambda: instance_uuid in agent_b.rebuilt)
    await aged(db_pool, pending)

    await move_deadline(db_pool, agent_transport).sweep()

    await until(lambda: agent_b.stopped == [instance_uuid])
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    # The agent's stop is no task of the server's: it stays in ERROR on its source.
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ERROR,
        None,
        node_a,
    )


async def test_a_recent_move_or_a_disabled_deadline_is_left_alone(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "dl-new")
    await host(conductor, agent_transport, "dl-new-b")
    migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
    await migration_status(db_pool, migration.uuid, MigrationStatus.FINISHED)
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.FINISHED)
    await aged(db_pool, pending)
    disabled = MoveDeadline(
        db_pool, ComputeAPI(agent_transport, timeout=SOON), timeout=0, down_time=60
    )

    assert await move_deadline(db_pool, agent_transport).sweep() == 0
    assert await disabled.sweep() == 0
    await migration_status(db_pool, migration.uuid, MigrationStatus.FINISHED)


async def test_a_power_task_past_its_deadline_is_cleared_once_by_two_sweeps(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, _, _ = await placed_on_a(db_pool, conductor, agent_transport, "dl-task")
    ctx = RequestContext(user_id="u", project_id="p")
    async with db_pool.acquire() as conn:
        assert await instances.begin_task(
            conn, instance_uuid, TaskState.POWERING_OFF, vm_states=(VmState.ACTIVE,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, "stop")
        fresh = TaskDeadline(db_pool, 600)
        assert await fresh.sweep() == 0
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            instance_uuid,
        )

    cleared = await asyncio.gather(*(TaskDeadline(db_pool, 600).sweep() for _ in range(2)))

    assert sorted(cleared) == [0, 1]
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        action = await conn.fetchrow(
            "SELECT * FROM instance_actions WHERE instance_uuid = $1 AND action = 'stop'",
            instance_uuid,
        )
    assert (instance.vm_state, instance.task_state) == (VmState.ACTIVE, None)
    assert action is not None
    assert action["finish_time"] is not None
    assert "timed out" in action["message"]


@pytest.mark.parametrize("placed", [False, True])
async def test_a_delete_timed_out_on_a_building_server_hands_it_back_to_its_build(
    db_pool: asyncpg.Pool, placed: bool
) -> None:
    """A delete cut off before it reached anyone, on a server still building: one pass of
    the deadlines gives it back its build's task and, the build being overdue too, ends
    the build in ERROR; two more passes at once change nothing."""
    instance_uuid = await create_instance(db_pool)
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET task_state = 'deleting', host = $2,
                                    created_at = now() - interval '2 hours',
                                    updated_at = now() - interval '1 hour'
                WHERE uuid = $1""",
            instance_uuid,
            "dl-building" if placed else None,
        )
        await instance_actions.start(conn, RequestContext(), instance_uuid, "delete")
    settings = Settings(build_timeout=600, task_timeout=600, move_timeout=0)
    compute = ComputeAPI(FakeTransport(), timeout=SOON)

    assert await Deadlines(db_pool, compute, settings).sweep() == 2
    again = await asyncio.gather(*(Deadlines(db_pool, compute, settings).sweep() for _ in range(2)))
    assert again == [0, 0]

    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        changes = await conn.fetchval(
            "SELECT count(*) FROM instance_actions WHERE instance_uuid = $1 AND "
            "finish_time IS NOT NULL AND action IN ('create', 'delete')",
            instance_uuid,
        )
    assert (instance.vm_state, instance.task_state) == (VmState.ERROR, None)
    assert instance.fault is not None
    assert "KEEL_BUILD_TIMEOUT" in instance.fault.message
    assert changes == 2


async def test_a_host_gone_for_good_is_deleted_after_its_servers_were_evacuated(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 3: the source's claim is released by the deletion; the record stays done."""
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "gone")
    registration_b, _ = await host(conductor, agent_transport, "gone-b")
    await force_down(db_pool, node_a)
    migration = await start_move(db_pool, conductor, EVACUATION, instance_uuid, node_a)
    await migration_status(db_pool, migration.uuid, MigrationStatus.DONE)
    assert await claims(db_pool, instance_uuid) == {
        ("instance", node_a),
        ("instance", registration_b.node_id),
    }
    async with db_pool.acquire() as conn:
        source = await compute_nodes.get_by_id(conn, node_a)
        assert source.service_id is not None
        service = await services.get_by_id(conn, source.service_id, 60)

        assert await service_maintenance.delete_service(conn, service, 60) == 1

        left = await allocations.for_instance(conn, instance_uuid)
    assert [(a.consumer_uuid, a.compute_node_id) for a in left] == [
        (instance_uuid, registration_b.node_id)
    ]
    await migration_status(db_pool, migration.uuid, MigrationStatus.DONE)
    assert await claims(db_pool, instance_uuid) == {("instance", registration_b.node_id)}


async def test_finding_1_an_evacuation_done_whose_server_came_back_confirms_nothing(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 1, the confirm list: evacuation A→B is ``done`` (A never confirmed it)
    while the server lives on A again, evacuated back from B. A's guest reports, two at
    once, must list nothing to remove (the copy on A is the server's); the record is
    completed instead."""
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "back")
    registration_b, _ = await host(conductor, agent_transport, "back-b")
    await force_down(db_pool, node_a)
    away = await start_move(db_pool, conductor, EVACUATION, instance_uuid, node_a)
    await migration_status(db_pool, away.uuid, MigrationStatus.DONE)
    ctx = RequestContext(user_id="u", project_id="p")
    async with db_pool.acquire() as conn, conn.transaction():
        a = await compute_nodes.get_by_id(conn, node_a)
        b = await compute_nodes.get_by_id(conn, registration_b.node_id)
        back = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=EVACUATION.migration_type,
            status=MigrationStatus.PRE_MIGRATING,
            source=b,
        )
        assert await moves.swap_status(
            conn, back.uuid, expected=[MigrationStatus.PRE_MIGRATING], new="done", dest=a
        )
        await conn.execute(
            "UPDATE instances SET host = $2, node = $3, compute_id = $4 WHERE uuid = $1",
            instance_uuid,
            a.host,
            a.hypervisor_hostname,
            a.id,
        )

    reports = await asyncio.gather(
        *(
            conductor.report_guests(RequestContext.internal(), a.uuid, [instance_uuid])
            for _ in range(2)
        )
    )

    for report in reports:
        assert report is not None
        assert report.to_confirm == []
        assert [v.fate for v in report.verdicts] == [GuestFate.KEEP]
    await migration_status(db_pool, away.uuid, MigrationStatus.COMPLETED)


async def test_deleting_a_server_during_a_move_cancels_it_and_its_late_copy_goes(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Delete wins: the move ends cancelled, and its late result removes the copy it made."""
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "del")
    _, destination = await silent_host(conductor, agent_transport, "del-b")
    migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
    await until(lambda: bool(destination.rebuilt))

    await asyncio.gather(
        conductor.instance_deleted(RequestContext(), instance_uuid),
        conductor.instance_deleted(RequestContext(), instance_uuid),
    )
    await migration_status(db_pool, migration.uuid, MigrationStatus.CANCELLED)
    assert await claims(db_pool, instance_uuid) == set()

    await asyncio.gather(
        conductor.move_result(RequestContext(), migration.uuid, success=True),
        conductor.move_result(RequestContext(), migration.uuid, success=True),
    )
    await until(lambda: instance_uuid in destination.removed)
    await migration_status(db_pool, migration.uuid, MigrationStatus.CANCELLED)


async def test_a_power_state_follows_the_hosts_report_once_the_row_is_quiet(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """A stop acted on after its task was cleared is recorded from the guest report."""
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "pow")
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_id(conn, node_a)
    ctx, shut_down = RequestContext(), {instance_uuid: PowerState.SHUTDOWN}

    await conductor.report_guests(ctx, node.uuid, [instance_uuid], shut_down)
    async with db_pool.acquire() as conn:
        recent = await instances.get(conn, instance_uuid)
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            instance_uuid,
        )
    assert recent.vm_state == VmState.ACTIVE  # changed moments ago: not yet

    await asyncio.gather(
        *(conductor.report_guests(ctx, node.uuid, [instance_uuid], shut_down) for _ in range(2))
    )
    async with db_pool.acquire() as conn:
        followed = await instances.get(conn, instance_uuid)
    assert (followed.vm_state, followed.power_state) == (VmState.STOPPED, PowerState.SHUTDOWN)


async def test_a_build_that_finishes_after_its_deadline_is_active_with_its_claim_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 8: a late success used to leave a running guest with no claim."""
    registration = await register(conductor, "late-a")
    agent = StandInMover(conductor)
    agent.report = False
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until(lambda: bool(agent.built))
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET created_at = now() - interval '1 hour' WHERE uuid = $1",
            instance_uuid,
        )
    assert await BuildDeadline(db_pool, 600).sweep() == 1
    assert await claims(db_pool, instance_uuid) == set()

    ctx = RequestContext()
    await asyncio.gather(
        *(conductor.instance_build_result(ctx, instance_uuid, success=True) for _ in range(2))
    )

    async def active() -> bool | None:
        async with db_pool.acquire() as conn:
            found = await instances.get(conn, instance_uuid)
        return True if found.vm_state == VmState.ACTIVE else None

    await eventually(active)
    await asyncio.sleep(0.5)  # the twin, too, has been handled
    assert await claims(db_pool, instance_uuid) == {("instance", registration.node_id)}


async def test_a_move_ended_while_its_destination_was_chosen_gives_the_claim_back(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 8: the claim the scheduler just made for a withdrawn move was kept."""
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "lost")
    registration_b = await register(conductor, "lost-b")
    ctx = RequestContext(user_id="u", project_id="p")
    async with db_pool.acquire() as conn, conn.transaction():
        source = await compute_nodes.get_by_id(conn, node_a)
        await instances.begin_task(
            conn, instance_uuid, MIGRATION.choosing, vm_states=MIGRATION.movable
        )
        migration = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=MIGRATION.migration_type,
            status=MigrationStatus.ACCEPTED,
            source=source,
        )
        instance = await instances.get(conn, instance_uuid)
        # The scheduler claimed on B for the move; then keel-api withdrew it.
        assert await allocations.claim(
            conn,
            registration_b.node_id,
            migration.uuid,
            instance.flavor,
            instance_uuid=instance_uuid,
        )
        await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.ACCEPTED], new=MigrationStatus.ERROR
        )
    task = MoveTask(
        ctx,
        migration.uuid,
        pool=db_pool,
        scheduler=SchedulerAPI(agent_transport, timeout=SOON),
        compute=ComputeAPI(agent_transport, timeout=SOON),
        service_down_time=60,
    )
    selection = Selection(
        service_uuid=registration_b.service_uuid,
        compute_node_id=registration_b.node_id,
        compute_node_uuid=registration_b.node_uuid,
        host="lost-b",
        nodename="lost-b",
    )

    assert await task._record_destination(migration, selection) is None

    assert await claims(db_pool, instance_uuid) == {("instance", node_a)}


async def test_a_result_and_the_deadline_racing_on_one_move_never_deadlock(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 11: both take the instance, then the record, then the claims."""
    compute = ComputeAPI(agent_transport, timeout=SOON)
    for round_ in range(5):
        async with db_pool.acquire() as conn:  # earlier rounds' hosts take no part
            await conn.execute("UPDATE services SET disabled = true")
        instance_uuid, node_a, _ = await placed_on_a(
            db_pool, conductor, agent_transport, f"race{round_}"
        )
        node_b, _ = await silent_host(conductor, agent_transport, f"race{round_}-b")
        migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
        pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
        await aged(db_pool, pending)
        aged_record = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
        result = MoveResult(migration_uuid=migration.uuid, success=True)

        await asyncio.gather(
            arrival.record_move_result(db_pool, compute, result, 60),
            move_deadline(db_pool, agent_transport)._expire(aged_record),
        )

        async with db_pool.acquire() as conn:
            ended = await moves.get(conn, migration.uuid)
        assert ended.status in (MigrationStatus.FINISHED, MigrationStatus.ERROR)
        held = await claims(db_pool, instance_uuid)
        if ended.status == MigrationStatus.FINISHED:
            assert held == {("instance", node_a), ("migration", node_b)}
        else:
            assert held == {("instance", node_a)}


async def test_a_destination_asks_whether_its_move_still_waits_for_the_copy(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """check_move: yes to the destination while the move is pre-migrating; no once the
    deadline ended it (a rebuild delivered late builds nothing); not to another node."""
    instance_uuid, node_a, _ = await placed_on_a(db_pool, conductor, agent_transport, "cm")
    registration_b = await register(conductor, "cm-b")
    await serve_stand_in(agent_transport, registration_b, Silent(conductor))
    migration = await start_move(db_pool, conductor, MIGRATION, instance_uuid, node_a)
    pending = await migration_status(db_pool, migration.uuid, MigrationStatus.PRE_MIGRATING)
    async with db_pool.acquire() as conn:
        node_a_uuid = (await compute_nodes.get_by_id(conn, node_a)).uuid
    ctx = RequestContext.internal()

    waits, elsewhere = await asyncio.gather(
        conductor.check_move(ctx, migration.uuid, registration_b.node_uuid),
        conductor.check_move(ctx, migration.uuid, node_a_uuid),
    )
    assert waits is not None
    assert waits.verdict is BuildVerdict.BUILD
    assert elsewhere is not None
    assert elsewhere.verdict is BuildVerdict.LEAVE

    await aged(db_pool, pending)
    await ended_by_two_sweeps(db_pool, agent_transport, migration)
    late = await conductor.check_move(ctx, migration.uuid, registration_b.node_uuid)
    assert late is not None
    assert late.verdict is BuildVerdict.ABANDON
    assert "error" in late.reason
