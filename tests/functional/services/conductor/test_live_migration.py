"""Live migration on real RabbitMQ and PostgreSQL: the conductor and two real agents'
handlers (fake driver), every cast delivered twice at once, and a sampler that checks
every few milliseconds that the server never has two running copies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

import asyncpg
import pytest

from services.compute.manager import ComputeManager
from services.compute.rpcapi import RPC_VERSION, topic_for
from services.compute.virt.fake import FakeDriver
from services.conductor.rpcapi import ConductorAPI, Registration
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances, live_moves, moves
from shared.objects.migration import Migration, MigrationStatus, MigrationType
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from shared.rpc.server import RPCServer
from tests.functional.services.conductor.stand_in import (
    create_instance,
    eventually,
    heartbeat,
    register,
    until,
    until_active,
)

pytestmark = pytest.mark.functional

S = MigrationStatus


@dataclass
class Agent:
    registration: Registration
    driver: FakeDriver
    manager: ComputeManager


async def agent(
    conductor: ConductorAPI,
    transport: AmqpTransport,
    name: str,
    *,
    seconds: float = 0.5,
    memory_mb: int = 2048,
) -> Agent:
    registration = await register(conductor, name, memory_mb=memory_mb)
    driver = FakeDriver(f"{name}.node")
    manager = ComputeManager(
        driver, conductor, node_uuid=registration.node_uuid, live_migration_seconds=seconds
    )
    server = RPCServer(
        transport, topic_for(registration.service_uuid), manager, version=RPC_VERSION
    )
    await server.start(prefetch=4)
    await heartbeat(conductor, registration)
    return Agent(registration, driver, manager)


class Sampler:
    """Counts the running copies of one server on every agent, every 2 ms."""

    def __init__(self, instance_uuid: UUID, agents: list[Agent]) -> None:
        self.instance_uuid = instance_uuid
        self.agents = agents
        self.most = 0
        self.samples = 0

    async def run(self) -> None:
        while True:
            running = sum(a.driver.is_running(self.instance_uuid) for a in self.agents)
            self.most = max(self.most, running)
            self.samples += 1
            await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def sampled(instance_uuid: UUID, agents: list[Agent]) -> AsyncIterator[Sampler]:
    sampler = Sampler(instance_uuid, agents)
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sampler.samples > 10
    assert sampler.most <= 1, "two running copies of the server at once"


async def built_on_a(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport, **b: int | float
) -> tuple[UUID, Agent, Agent]:
    a = await agent(conductor, transport, "live-a", seconds=float(b.pop("seconds", 0.5)))
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    b_agent = await agent(
        conductor,
        transport,
        "live-b",
        memory_mb=int(b.pop("memory_mb", 2048)),
    )
    return instance_uuid, a, b_agent


async def record(
    pool: asyncpg.Pool,
    instance_uuid: UUID,
    source: Registration,
    *,
    vm_state: VmState = VmState.ACTIVE,
) -> Migration:
    """What keel-api records for os-migrateLive."""
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        node = await compute_nodes.get_by_uuid(conn, source.node_uuid)
        assert await instances.begin_task(
            conn, instance_uuid, TaskState.MIGRATING, vm_states=(vm_state,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, "live-migration")
        return await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=MigrationType.LIVE_MIGRATION,
            status=S.ACCEPTED,
            source=node,
        )


async def status_of(pool: asyncpg.Pool, migration_uuid: UUID, *statuses: str) -> Migration:
    async def check() -> Migration | None:
        async with pool.acquire() as conn:
            found = await moves.get(conn, migration_uuid)
        return found if found.status in statuses else None

    return await eventually(check)


async def claims(pool: asyncpg.Pool, instance_uuid: UUID) -> set[tuple[str, int]]:
    async with pool.acquire() as conn:
        held = await allocations.for_instance(conn, instance_uuid)
        assert await allocations.usage_drift(conn) == []
    return {
        ("instance" if a.consumer_uuid == instance_uuid else "migration", a.compute_node_id)
        for a in held
    }


async def cast_twice(conductor: ConductorAPI, migration: Migration) -> None:
    ctx = RequestContext()
    await asyncio.gather(
        conductor.live.live_migrate_instance(ctx, migration.uuid),
        conductor.live.live_migrate_instance(ctx, migration.uuid),
    )


async def test_a_live_migration_delivered_twice_moves_the_running_server_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, a, b = await built_on_a(db_pool, conductor, agent_transport)
    migration = await record(db_pool, instance_uuid, a.registration)

    async with sampled(instance_uuid, [a, b]):
        await cast_twice(conductor, migration)
        done = await status_of(db_pool, migration.uuid, S.COMPLETED, S.FAILED, S.ERROR)
        await until(lambda: not a.driver.guest(instance_uuid))

    assert done.status == S.COMPLETED
    assert done.dest_compute_id == b.registration.node_id
    assert done.memory_processed_bytes == done.memory_total_bytes == 512 * 1024 * 1024
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id, instance.host) == (
        VmState.ACTIVE,
        None,
        b.registration.node_id,
        "live-b",
    )
    assert instance.copy_token == migration.uuid
    assert b.driver.is_running(instance_uuid)
    assert await b.driver.origin(instance_uuid) == migration.uuid
    assert await claims(db_pool, instance_uuid) == {("instance", b.registration.node_id)}


async def running(pool: asyncpg.Pool, migration_uuid: UUID) -> Migration:
    async def check() -> Migration | None:
        async with pool.acquire() as conn:
            found = await moves.get(conn, migration_uuid)
        copied = found.memory_processed_bytes or 0
        return found if found.status == S.RUNNING and copied > 0 else None

    return await eventually(check)


async def test_an_abort_in_flight_leaves_the_server_running_on_its_source(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, a, b = await built_on_a(db_pool, conductor, agent_transport, seconds=20)
    migration = await record(db_pool, instance_uuid, a.registration)

    async with sampled(instance_uuid, [a, b]):
        await cast_twice(conductor, migration)
        under_way = await running(db_pool, migration.uuid)
        assert (under_way.memory_remaining_bytes or 0) > 0
        async with db_pool.acquire() as conn, conn.transaction():
            aborted = await live_moves.end_in(
                conn, migration.uuid, (S.RUNNING,), S.CANCELLED, "aborted"
            )
        assert aborted is not None
        await until(lambda: "live migration" not in a.manager.in_flight().values())

    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        ended = await moves.get(conn, migration.uuid)
    assert ended.status == S.CANCELLED
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        a.registration.node_id,
    )
    assert a.driver.is_running(instance_uuid)
    assert b.driver.guest(instance_uuid) is None
    assert await claims(db_pool, instance_uuid) == {("instance", a.registration.node_id)}


async def test_force_complete_in_flight_switches_over_at_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, a, b = await built_on_a(db_pool, conductor, agent_transport, seconds=600)
    migration = await record(db_pool, instance_uuid, a.registration)

    async with sampled(instance_uuid, [a, b]):
        await cast_twice(conductor, migration)
        await running(db_pool, migration.uuid)
        async with db_pool.acquire() as conn:
            assert await live_moves.ask_force_complete(conn, migration.uuid) is not None
        done = await status_of(db_pool, migration.uuid, S.COMPLETED, S.FAILED, S.ERROR)

    assert done.status == S.COMPLETED
    assert (done.memory_remaining_bytes or 0) > 0  # cut short, not copied to the end
    assert b.driver.is_running(instance_uuid)


async def test_a_switch_over_after_an_admin_reset_the_task_keeps_the_server_on_its_source(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 30: os-resetState ends the server's task while the copy runs; the
    switch-over then fails the migration and the source resumes the server's guest."""
    instance_uuid, a, b = await built_on_a(db_pool, conductor, agent_transport, seconds=600)
    migration = await record(db_pool, instance_uuid, a.registration)

    async with sampled(instance_uuid, [a, b]):
        await cast_twice(conductor, migration)
        await running(db_pool, migration.uuid)
        async with db_pool.acquire() as conn:
            # What os-resetState writes: the state the admin asked for, no task.
            await conn.execute(
                "UPDATE instances SET vm_state = 'active', task_state = NULL WHERE uuid = $1",
                instance_uuid,
            )
            assert await live_moves.ask_force_complete(conn, migration.uuid) is not None
        done = await status_of(db_pool, migration.uuid, S.COMPLETED, S.FAILED, S.ERROR)
        await until(lambda: "live migration" not in a.manager.in_flight().values())

    assert done.status == S.FAILED
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        a.registration.node_id,
    )
    assert a.driver.is_running(instance_uuid)
    assert b.driver.guest(instance_uuid) is None
    assert await claims(db_pool, instance_uuid) == {("instance", a.registration.node_id)}


async def test_no_valid_host_ends_in_error_with_the_server_active_on_its_source(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, a, _b = await built_on_a(db_pool, conductor, agent_transport, memory_mb=128)
    migration = await record(db_pool, instance_uuid, a.registration)

    await cast_twice(conductor, migration)
    ended = await status_of(db_pool, migration.uuid, S.ERROR, S.FAILED, S.COMPLETED)

    assert ended.status == S.ERROR
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        a.registration.node_id,
    )
    assert a.driver.is_running(instance_uuid)
    assert await claims(db_pool, instance_uuid) == {("instance", a.registration.node_id)}


async def test_a_destination_that_cannot_live_migrate_fails_it_and_nothing_moves(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, a, b = await built_on_a(db_pool, conductor, agent_transport)
    b.driver.live_migration_refusal = "this driver cannot move a running guest"  # type: ignore[attr-defined]
    migration = await record(db_pool, instance_uuid, a.registration)

    await cast_twice(conductor, migration)
    ended = await status_of(db_pool, migration.uuid, S.ERROR, S.FAILED, S.COMPLETED)

    assert ended.status == S.FAILED
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        [action] = [
            x for x in await instance_actions.list_for(conn, instance_uuid)
            if x.action == "live-migration"
        ]  # fmt: skip
    assert (instance.vm_state, instance.task_state, instance.compute_id) == (
        VmState.ACTIVE,
        None,
        a.registration.node_id,
    )
    assert "cannot move a running guest" in (action.message or "")
    assert b.driver.guest(instance_uuid) is None
    assert await claims(db_pool, instance_uuid) == {("instance", a.registration.node_id)}


async def test_a_paused_server_arrives_paused(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, a, b = await built_on_a(db_pool, conductor, agent_transport)
    await a.driver.pause(instance_uuid)
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'paused', power_state = 3 WHERE uuid = $1",
            instance_uuid,
        )
    migration = await record(db_pool, instance_uuid, a.registration, vm_state=VmState.PAUSED)

    await cast_twice(conductor, migration)
    done = await status_of(db_pool, migration.uuid, S.COMPLETED, S.FAILED, S.ERROR)

    assert done.status == S.COMPLETED
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.compute_id) == (VmState.PAUSED, b.registration.node_id)
    assert b.driver.is_paused(instance_uuid)
    await until(lambda: a.driver.guest(instance_uuid) is None)
