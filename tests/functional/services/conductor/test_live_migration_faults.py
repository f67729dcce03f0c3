"""Live migration's start, progress, switch-over and deadline sweep, each of their
database and broker calls failing once, on real PostgreSQL and RabbitMQ.

The conductor's start (``live_migrate_instance``) is a cast, delivered again after a
transient failure; the source's agent reports progress and asks for the switch-over
with calls, retried by the conductor's RPC server or, once that gives up, by the
agent's ``live_migrate`` delivered again; the deadline's sweep tries again on its next
pass. A call fails when the connection dropped before a statement or a commit reached
PostgreSQL, or after it took effect with its answer lost; when a publish was not
confirmed, or a call was handled with its answer lost. Each call fails in turn; after
the fault the migration is where it was or one step on, never half-switched, and once
the work is done again the server runs on its destination alone with one claim there,
its action ended once (or, past the deadline before the switch-over, on its source,
running).

The source is a real agent (fake driver) whose ``live_migrate`` is held, so the test
runs it, or the conductor's step, itself; the destination is a real agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from services.compute.live_rpc import LiveMigrate
from services.compute.manager import ComputeManager
from services.compute.rpcapi import RPC_VERSION, ComputeAPI, topic_for
from services.compute.virt.fake import FakeDriver
from services.conductor.live_rpc import (
    LiveAction,
    LiveMigrationProgress,
    LiveMigrationSwitch,
    SwitchOutcome,
)
from services.conductor.moves import live, live_deadline
from services.conductor.rpcapi import ConductorAPI, Registration
from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, instances, moves
from shared.exceptions import MessagingError
from shared.objects.instance import RequestedDestination
from shared.objects.migration import LIVE_MIGRATION, Migration, MigrationStatus, MigrationType
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from shared.rpc.transport import Transport
from tests.functional.faults import BrokerFailsOnce, FailsOnce, every_call
from tests.functional.services.conductor.conftest import SOON
from tests.functional.services.conductor.stand_in import (
    create_instance,
    eventually,
    heartbeat,
    register,
    until_active,
)
from tests.functional.services.conductor.test_live_migration import claims

pytestmark = pytest.mark.functional

S = MigrationStatus
DOWN_TIME = 60.0
#: What the database and the broker raise for a call that failed once.
FAILED = (asyncpg.ConnectionDoesNotExistError, MessagingError)
_names = itertools.count()


class HeldSource(ComputeManager):
    """A source agent that keeps the ``live_migrate`` it is sent for the test to run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: asyncio.Queue[LiveMigrate] = asyncio.Queue()

    async def live_migrate(self, ctx: RequestContext, req: LiveMigrate) -> None:
        await self.held.put(req)


@dataclass
class Agent:
    registration: Registration
    driver: FakeDriver
    manager: ComputeManager

    @property
    def node_id(self) -> int:
        return self.registration.node_id


async def agent(
    conductor: ConductorAPI, transport: AmqpTransport, name: str, kind: type[ComputeManager]
) -> Agent:
    registration = await register(conductor, name)
    driver = FakeDriver(f"{name}.node")
    manager = kind(driver, conductor, node_uuid=registration.node_uuid, live_migration_seconds=0.25)
    topic = topic_for(registration.service_uuid)
    server = RPCServer(transport, topic, manager, version=RPC_VERSION)
    await server.start(prefetch=4)
    await heartbeat(conductor, registration)
    return Agent(registration, driver, manager)


@dataclass
class Running:
    """A live migration keel-api recorded (``accepted``), or that the conductor started
    (``running``, its copy under way)."""

    instance_uuid: UUID
    migration: Migration
    source: Agent
    dest: Agent
    #: The copy token of the server's guest on its source.
    token: UUID | None
    #: The ``live_migrate`` the conductor sent the source (once running).
    request: LiveMigrate | None = None


async def accepted(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport
) -> Running:
    """A server built on a host of its own, whose live migration to another (named,
    forced) keel-api recorded."""
    n = next(_names)
    source = await agent(conductor, transport, f"lmf-{n}-a", HeldSource)
    instance_uuid = await create_instance(pool)
    on_source = RequestedDestination(node_ids=[source.node_id], forced=True)
    await conductor.build_instances(RequestContext(), instance_uuid, on_source)
    await until_active(pool, instance_uuid)
    dest = await agent(conductor, transport, f"lmf-{n}-b", ComputeManager)
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        node = await compute_nodes.get_by_uuid(conn, source.registration.node_uuid)
        assert await instances.begin_task(
            conn, instance_uuid, TaskState.MIGRATING, vm_states=(VmState.ACTIVE,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, "live-migration")
        migration = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=MigrationType.LIVE_MIGRATION,
            status=S.ACCEPTED,
            source=node,
            dest_host=f"lmf-{n}-b",
            forced=True,
        )
        token = (await instances.get(conn, instance_uuid)).copy_token
    return Running(instance_uuid, migration, source, dest, token)


async def copying(pool: asyncpg.Pool, move: Running) -> Running:
    """Once the source was sent its ``live_migrate`` and the record is ``running``."""
    assert isinstance(move.source.manager, HeldSource)
    request = await asyncio.wait_for(move.source.manager.held.get(), SOON)

    async def started() -> Migration | None:
        async with pool.acquire() as conn:
            found = await moves.get(conn, move.migration.uuid)
        return found if found.status == S.RUNNING else None

    migration = await eventually(started)
    assert migration.dest_compute_id == move.dest.node_id
    move.migration, move.request = migration, request
    return move


async def running(pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport) -> Running:
    """A live migration the conductor started: ``running``, the source's copy held."""
    move = await accepted(pool, conductor, transport)
    await conductor.live.live_migrate_instance(RequestContext(), move.migration.uuid)
    return await copying(pool, move)


async def where(pool: asyncpg.Pool, move: Running) -> tuple[Any, ...]:
    """The migration's status, the server's node, vm and task states and copy token, its
    claims (usage matching them) and how many times its action ended."""
    async with pool.acquire() as conn:
        found = await moves.get(conn, move.migration.uuid)
        instance = await instances.get(conn, move.instance_uuid)
        [action] = [
            a
            for a in await instance_actions.list_for(conn, move.instance_uuid)
            if a.action == "live-migration"
        ]
    held = await claims(pool, move.instance_uuid)
    return (
        found.status,
        instance.compute_id,
        instance.vm_state,
        instance.task_state,
        instance.copy_token,
        held,
        action.finish_time is not None,
    )


def before_switch(move: Running, status: str) -> tuple[Any, ...]:
    """Where a migration not yet switched over leaves the server: on its source."""
    source, dest = move.source.node_id, move.dest.node_id
    return (
        status,
        source,
        VmState.ACTIVE,
        TaskState.MIGRATING,
        move.token,
        {("instance", source), ("migration", dest)},
        False,
    )


def switched(move: Running) -> tuple[Any, ...]:
    dest = move.dest.node_id
    return (
        S.COMPLETED,
        dest,
        VmState.ACTIVE,
        None,
        move.migration.uuid,
        {("instance", dest)},
        True,
    )


async def only_on_the_destination(move: Running) -> None:
    """The destination runs the copy this move made; the source's is not running."""
    assert move.dest.driver.is_running(move.instance_uuid)
    assert await move.dest.driver.origin(move.instance_uuid) == move.migration.uuid
    assert not move.source.driver.is_running(move.instance_uuid)


@contextlib.asynccontextmanager
async def failing_once(flaky: FailsOnce | BrokerFailsOnce, *, caught: bool = False) -> Any:
    """Expect the fault to fire and be raised, or (past the last call) no fault at all;
    ``caught``: the handler may also log it and return (the deadline's sweep leaves
    what a broker failure stopped to its next pass)."""
    try:
        yield
    except FAILED:
        assert flaky.failed, flaky.calls
    else:
        assert caught or not flaky.failed, flaky.calls


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_progress_whose_database_call_fails_once_is_recorded_when_asked_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    move = await running(db_pool, conductor, agent_transport)
    memory = 512 * 1024 * 1024

    async def scenario(at: int) -> FailsOnce:
        report = LiveMigrationProgress(
            migration_uuid=move.migration.uuid,
            compute_node_uuid=move.source.registration.node_uuid,
            memory_total_bytes=memory,
            memory_processed_bytes=memory // 64 * (at + 1),
            disk_total_bytes=0,
            disk_processed_bytes=0,
        )
        flaky = FailsOnce(db_pool, at, answered=answered)
        async with failing_once(flaky):
            await live.progress(flaky.as_pool(), report)
        directive = await live.progress(db_pool, report)
        assert directive.action is LiveAction.CONTINUE, directive
        async with db_pool.acquire() as conn:
            found = await moves.get(conn, move.migration.uuid)
        assert (found.status, found.memory_processed_bytes) == (
            S.RUNNING,
            report.memory_processed_bytes,
        )
        return flaky

    assert await every_call(scenario) >= (2 if answered else 3)
    assert await where(db_pool, move) == before_switch(move, S.RUNNING)


async def switch_once_failed(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    transport: AmqpTransport,
    *,
    db_at: int | None,
    broker_at: int | None,
    answered: bool,
) -> FailsOnce | BrokerFailsOnce:
    """The source asks for the switch-over and one of the conductor's calls fails; then
    it asks again, twice at once."""
    move = await running(pool, conductor, transport)
    await move.source.driver.pause(move.instance_uuid)  # as the source does first
    flaky_db = FailsOnce(pool, db_at, answered=answered)
    flaky_broker = BrokerFailsOnce(transport, broker_at, answered=answered)
    flaky = flaky_db if db_at is not None else flaky_broker
    ask = LiveMigrationSwitch(
        migration_uuid=move.migration.uuid,
        compute_node_uuid=move.source.registration.node_uuid,
    )

    async with failing_once(flaky):
        await live.switch(
            flaky_db.as_pool(),
            ComputeAPI(flaky_broker, timeout=SOON),
            ask,
            down_time=DOWN_TIME,
        )
    assert await where(pool, move) in (
        before_switch(move, S.RUNNING),
        before_switch(move, S.POST_MIGRATING),
        switched(move),
    ), flaky.calls

    answers = await asyncio.gather(
        *(
            live.switch(pool, ComputeAPI(transport, timeout=SOON), ask, down_time=DOWN_TIME)
            for _ in "ab"
        )
    )
    assert {a.outcome for a in answers} == {SwitchOutcome.COMPLETED}, answers
    assert await where(pool, move) == switched(move), flaky.calls
    await only_on_the_destination(move)
    return flaky


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_switch_over_whose_database_call_fails_once_completes_when_asked_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def scenario(at: int) -> FailsOnce | BrokerFailsOnce:
        return await switch_once_failed(
            db_pool, conductor, agent_transport, db_at=at, broker_at=None, answered=answered
        )

    assert await every_call(scenario) >= (3 if answered else 10)


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_switch_over_whose_start_live_copy_fails_once_completes_when_asked_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def scenario(at: int) -> FailsOnce | BrokerFailsOnce:
        return await switch_once_failed(
            db_pool, conductor, agent_transport, db_at=None, broker_at=at, answered=answered
        )

    assert await every_call(scenario) == 1  # start_live_copy, to the destination


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_source_whose_call_to_the_conductor_fails_once_switches_over_when_delivered_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def scenario(at: int) -> BrokerFailsOnce:
        move = await running(db_pool, conductor, agent_transport)
        flaky = BrokerFailsOnce(agent_transport, at, answered=answered)
        source = move.source

        def manager(transport: BrokerFailsOnce | AmqpTransport) -> ComputeManager:
            return ComputeManager(
                source.driver,
                ConductorAPI(transport, timeout=SOON),
                node_uuid=source.registration.node_uuid,
                live_migration_seconds=0.25,
            )

        ctx = RequestContext()
        assert move.request is not None
        async with failing_once(flaky):
            await manager(flaky).live_migrate(ctx, move.request)
        # Delivered again (the failed delivery's guest is paused, or already gone).
        await manager(agent_transport).live_migrate(ctx, move.request)
        assert await where(db_pool, move) == switched(move), flaky.calls
        await only_on_the_destination(move)
        assert source.driver.guest(move.instance_uuid) is None
        return flaky

    # Progress twice (a quarter-second copy), then the switch-over.
    assert await every_call(scenario) == 3


async def overdue() -> None:
    """Past the tests' deadline: every record unchanged for longer than ``TIMEOUT``."""
    await asyncio.sleep(TIMEOUT * 2)


TIMEOUT = 0.05


async def sweep_once_failed(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    transport: AmqpTransport,
    *,
    db_at: int | None,
    broker_at: int | None,
    answered: bool,
) -> FailsOnce | BrokerFailsOnce:
    """A migration stalled during its switch-over (the conductor that recorded
    ``post-migrating`` died): the deadline's sweep carries it forward, one of its calls
    failing; the next sweep finishes it."""
    move = await running(pool, conductor, transport)
    await move.source.driver.pause(move.instance_uuid)
    async with pool.acquire() as conn:
        assert await moves.swap_status(
            conn, move.migration.uuid, expected=[S.RUNNING], new=S.POST_MIGRATING
        )
    await overdue()
    flaky_db = FailsOnce(pool, db_at, answered=answered)
    flaky_broker = BrokerFailsOnce(transport, broker_at, answered=answered)
    flaky = flaky_db if db_at is not None else flaky_broker

    async with failing_once(flaky, caught=flaky is flaky_broker):
        await live_deadline.sweep(
            flaky_db.as_pool(),
            ComputeAPI(flaky_broker, timeout=SOON),
            timeout=TIMEOUT,
            down_time=DOWN_TIME,
        )
    assert await where(pool, move) in (
        before_switch(move, S.POST_MIGRATING),
        switched(move),
    ), flaky.calls
    await overdue()
    await live_deadline.sweep(
        pool, ComputeAPI(transport, timeout=SOON), timeout=TIMEOUT, down_time=DOWN_TIME
    )
    assert await where(pool, move) == switched(move), flaky.calls
    await only_on_the_destination(move)
    return flaky


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_stalled_switch_over_whose_sweep_fails_once_is_carried_forward_by_the_next(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def on_the_database(at: int) -> FailsOnce | BrokerFailsOnce:
        return await sweep_once_failed(
            db_pool, conductor, agent_transport, db_at=at, broker_at=None, answered=answered
        )

    async def on_the_broker(at: int) -> FailsOnce | BrokerFailsOnce:
        return await sweep_once_failed(
            db_pool, conductor, agent_transport, db_at=None, broker_at=at, answered=answered
        )

    assert await every_call(on_the_database) >= (3 if answered else 10)
    # start_live_copy to the destination, then the source's copy removed.
    assert await every_call(on_the_broker) == 2


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_an_overdue_copy_whose_sweep_fails_once_ends_on_the_source_running(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def scenario(at: int) -> FailsOnce:
        move = await running(db_pool, conductor, agent_transport)
        # The source paused its guest to switch over, and was never heard from again.
        await move.source.driver.pause(move.instance_uuid)
        await overdue()
        flaky = FailsOnce(db_pool, at, answered=answered)
        compute = ComputeAPI(agent_transport, timeout=SOON)
        ended = (
            S.ERROR,
            move.source.node_id,
            VmState.ACTIVE,
            None,
            move.token,
            {("instance", move.source.node_id)},
            True,
        )
        async with failing_once(flaky):
            await live_deadline.sweep(
                flaky.as_pool(), compute, timeout=TIMEOUT, down_time=DOWN_TIME
            )
        assert await where(db_pool, move) in (before_switch(move, S.RUNNING), ended)
        await overdue()
        await live_deadline.sweep(db_pool, compute, timeout=TIMEOUT, down_time=DOWN_TIME)
        assert await where(db_pool, move) == ended
        # The source's live_migrate delivered again finds the migration ended.
        assert isinstance(move.source.manager, HeldSource)
        assert move.request is not None
        await ComputeManager.live_migrate(move.source.manager, RequestContext(), move.request)
        assert move.source.driver.is_running(move.instance_uuid)
        assert move.dest.driver.guest(move.instance_uuid) is None
        return flaky

    assert await every_call(scenario) >= (2 if answered else 5)


async def start_once_failed(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    transport: AmqpTransport,
    *,
    db_at: int | None,
    broker_at: int | None,
    answered: bool,
) -> FailsOnce | BrokerFailsOnce:
    """The conductor starts a live migration (scheduling, preparing the destination,
    sending the source its copy) and one of its calls fails; the message is delivered
    again; the source then copies and switches over."""
    move = await accepted(pool, conductor, transport)
    flaky_db = FailsOnce(pool, db_at, answered=answered)
    flaky_broker = BrokerFailsOnce(transport, broker_at, answered=answered)
    flaky = flaky_db if db_at is not None else flaky_broker

    def task(on: asyncpg.Pool, over: Transport) -> live.LiveMoveTask:
        return live.LiveMoveTask(
            RequestContext(),
            move.migration.uuid,
            pool=on,
            scheduler=SchedulerAPI(over, timeout=SOON),
            compute=ComputeAPI(over, timeout=SOON),
            service_down_time=DOWN_TIME,
        )

    async with failing_once(flaky):
        await task(flaky_db.as_pool(), flaky_broker).run()
    state = await where(pool, move)
    assert state[0] in (S.ACCEPTED, S.PREPARING, S.RUNNING), (flaky.calls, state)
    assert state[1:5] == before_switch(move, state[0])[1:5], (flaky.calls, state)

    # Delivered again, twice at once.
    await asyncio.gather(task(pool, transport).run(), task(pool, transport).run())
    await copying(pool, move)
    assert await where(pool, move) == before_switch(move, S.RUNNING), flaky.calls
    # The source copies, and switches over, for each live_migrate it was sent.
    assert isinstance(move.source.manager, HeldSource)
    held = [move.request]
    while not move.source.manager.held.empty():
        held.append(move.source.manager.held.get_nowait())
    await asyncio.gather(
        *(
            ComputeManager.live_migrate(move.source.manager, RequestContext(), request)
            for request in held
            if request is not None
        )
    )
    assert await where(pool, move) == switched(move), flaky.calls
    await only_on_the_destination(move)
    return flaky


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_start_whose_database_call_fails_once_goes_on_when_delivered_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def scenario(at: int) -> FailsOnce | BrokerFailsOnce:
        return await start_once_failed(
            db_pool, conductor, agent_transport, db_at=at, broker_at=None, answered=answered
        )

    assert await every_call(scenario) >= (3 if answered else 10)


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_start_whose_broker_call_fails_once_goes_on_when_delivered_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport, answered: bool
) -> None:
    async def scenario(at: int) -> FailsOnce | BrokerFailsOnce:
        return await start_once_failed(
            db_pool, conductor, agent_transport, db_at=None, broker_at=at, answered=answered
        )

    # The scheduler's choice, the destination's check, the source's live_migrate.
    assert await every_call(scenario) >= 3


async def test_a_twin_that_records_its_choice_after_the_move_went_on_keeps_the_claim(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Two deliveries of one start: the scheduler gives both the same claim; the first
    carries the move on to ``running`` before the second records its choice. The second
    must leave that claim alone: the move goes on with it."""
    move = await accepted(db_pool, conductor, agent_transport)

    def task() -> live.LiveMoveTask:
        return live.LiveMoveTask(
            RequestContext(),
            move.migration.uuid,
            pool=db_pool,
            scheduler=SchedulerAPI(agent_transport, timeout=SOON),
            compute=ComputeAPI(agent_transport, timeout=SOON),
            service_down_time=DOWN_TIME,
        )

    twin = task()
    twin.kind = LIVE_MIGRATION
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, move.instance_uuid)
    selection = await twin._schedule(move.migration, instance)

    await task().run()
    await copying(db_pool, move)
    assert await twin._record_destination(move.migration, selection) is None

    assert await where(db_pool, move) == before_switch(move, S.RUNNING)


async def test_a_forced_live_migration_to_a_host_forced_down_ends_at_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Forcing a destination skips the scheduler's filters, not the check that its
    compute service is up: a live migration forced to a host forced down ends in error
    at once (delivered twice at the same time too), the server where it was, nothing
    claimed there; no call is left to time out delivery after delivery."""
    move = await accepted(db_pool, conductor, agent_transport)
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE services SET forced_down = true WHERE uuid = $1",
            move.dest.registration.service_uuid,
        )

    await asyncio.gather(
        *(conductor.live.live_migrate_instance(RequestContext(), move.migration.uuid) for _ in "ab")
    )

    async def ended() -> tuple[Any, ...] | None:
        found = await where(db_pool, move)
        return found if found[0] == S.ERROR else None

    _, node, vm, task, token, held, finished = await eventually(ended)
    assert (node, vm, task, token) == (move.source.node_id, VmState.ACTIVE, None, move.token)
    assert held == {("instance", move.source.node_id)}
    assert finished
    async with db_pool.acquire() as conn:
        [action] = [
            a
            for a in await instance_actions.list_for(conn, move.instance_uuid)
            if a.action == "live-migration"
        ]
    assert "is down" in (action.message or ""), action
