"""The build workflow end to end: API cast → conductor → scheduler → stand-in agent → back.

The real scheduler and conductor mains run against real PostgreSQL and RabbitMQ; the
agent is a stand-in served on ``compute.<service uuid>``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import ComputeAPI
from services.conductor import instance_events
from services.conductor.manager import ConductorManager
from services.conductor.rpcapi import (
    BuildInstances,
    BuildVerdict,
    ConductorAPI,
    CopyToken,
    InstanceBuildResult,
)
from services.scheduler.rpcapi import SchedulerAPI
from shared.context import RequestContext
from shared.db import allocations, compute_nodes, instance_actions, instances
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance, RequestedDestination
from shared.rpc.amqp import AmqpTransport
from shared.versions import COPY_TOKENS_VERSION
from tests.functional.faults import FailsOnce, every_call
from tests.functional.services.conductor.stand_in import (
    SMALL,
    StandInCompute,
    create_instance,
    eventually,
    heartbeat,
    register,
    serve_stand_in,
    until,
)

pytestmark = pytest.mark.functional


async def settled(pool: asyncpg.Pool, instance_uuid: UUID, vm_state: str) -> Instance:
    """The instance, once it has reached ``vm_state``."""

    async def check() -> Instance | None:
        async with pool.acquire() as conn:
            instance = await instances.get(conn, instance_uuid)
        return instance if instance.vm_state == vm_state else None

    return await eventually(check)


async def held(pool: asyncpg.Pool, instance_uuid: UUID) -> int:
    async with pool.acquire() as conn:
        return len(await allocations.for_instance(conn, instance_uuid))


async def create_action(pool: asyncpg.Pool, instance_uuid: UUID) -> asyncpg.Record:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT * FROM instance_actions WHERE instance_uuid = $1 AND action = 'create'",
            instance_uuid,
        )
    assert row is not None
    return row


async def test_build_reaches_active_on_the_chosen_host(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    await register(conductor, "small-host", memory_mb=1024)
    big = await register(conductor, "big-host", memory_mb=4096)
    agent = StandInCompute(conductor)
    await serve_stand_in(agent_transport, big, agent)
    instance_uuid = await create_instance(db_pool)

    await conductor.build_instances(RequestContext(user_id="u", project_id="p"), instance_uuid)

    instance = await settled(db_pool, instance_uuid, "active")
    assert (instance.host, instance.node) == ("big-host", "big-host.node")
    assert instance.task_state is None
    assert instance.launched_at is not None
    assert [(s.uuid, s.node, s.flavor, s.image_ref) for s in agent.built] == [
        (instance_uuid, "big-host.node", SMALL, "image-1")
    ]
    async with db_pool.acquire() as conn:
        claims = await allocations.for_instance(conn, instance_uuid)
    assert [c.compute_node_id for c in claims] == [big.node_id]
    action = await create_action(db_pool, instance_uuid)
    assert action["finish_time"] is not None
    assert action["message"] is None


async def test_no_valid_host_ends_in_error_with_the_fault_and_no_claim(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "host", memory_mb=1024)
    agent = StandInCompute(conductor)
    await serve_stand_in(agent_transport, registration, agent)
    huge = FlavorSnapshot(flavorid="9", name="huge", vcpus=1, memory_mb=8192, root_gb=1)
    instance_uuid = await create_instance(db_pool, huge)

    await conductor.build_instances(RequestContext(), instance_uuid)

    instance = await settled(db_pool, instance_uuid, "error")
    assert instance.fault is not None
    assert instance.fault.message.startswith("No valid host was found")
    assert instance.fault.code == 500
    assert instance.host is None
    assert await held(db_pool, instance_uuid) == 0
    assert agent.built == []
    action = await create_action(db_pool, instance_uuid)
    assert action["finish_time"] is not None
    assert action["message"].startswith("No valid host was found")


async def test_reported_build_failure_ends_in_error_and_releases_the_claim(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "host")
    agent = StandInCompute(conductor, fail_with="Build failed: disk image is corrupt")
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)

    await conductor.build_instances(RequestContext(), instance_uuid)

    instance = await settled(db_pool, instance_uuid, "error")
    assert instance.fault is not None
    assert instance.fault.message == "Build failed: disk image is corrupt"
    assert await held(db_pool, instance_uuid) == 0
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
    assert (node.vcpus_used, node.memory_mb_used, node.local_gb_used) == (0, 0, 0)
    action = await create_action(db_pool, instance_uuid)
    assert action["message"] == "Build failed: disk image is corrupt"


async def test_unreachable_host_ends_in_error_and_releases_the_claim(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    # Registered and reported up, but nothing consumes its compute.<service uuid> queue.
    registration = await register(conductor, "gone-host")
    await heartbeat(conductor, registration)
    instance_uuid = await create_instance(db_pool)

    await conductor.build_instances(RequestContext(), instance_uuid)

    instance = await settled(db_pool, instance_uuid, "error")
    assert instance.fault is not None
    assert "gone-host has no queue on the broker" in instance.fault.message
    assert await held(db_pool, instance_uuid) == 0
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
    assert node.memory_mb_used == 0


async def test_repeated_build_request_changes_nothing(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "host")
    agent = StandInCompute(conductor)
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    before = await settled(db_pool, instance_uuid, "active")

    # The cast delivered once more (at-least-once), handled by a second conductor.
    manager = ConductorManager(
        db_pool,
        SchedulerAPI(agent_transport, timeout=10),
        ComputeAPI(agent_transport, timeout=10),
        service_down_time=60,
    )
    agent.built.clear()
    await manager.build_instances(RequestContext(), BuildInstances(instance_uuid=instance_uuid))

    async with db_pool.acquire() as conn:
        after = await instances.get(conn, instance_uuid)
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
    assert after == before
    assert agent.built == []
    assert await held(db_pool, instance_uuid) == 1
    assert node.memory_mb_used == SMALL.memory_mb


async def test_result_for_an_instance_deleted_during_its_build_releases_the_claim(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "host")
    agent = StandInCompute(conductor)
    agent.report = False
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await eventually(lambda: _some(agent.built))
    async with db_pool.acquire() as conn:
        assert await instances.soft_delete(conn, instance_uuid)
    assert await held(db_pool, instance_uuid) == 1

    await conductor.instance_build_result(RequestContext(), instance_uuid, success=True)

    async def released() -> bool | None:
        return True if await held(db_pool, instance_uuid) == 0 else None

    await eventually(released)
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
    assert node.memory_mb_used == 0


async def test_instance_deleted_releases_claim_soft_deletes_and_is_idempotent(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "host")
    await serve_stand_in(agent_transport, registration, StandInCompute(conductor))
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await settled(db_pool, instance_uuid, "active")
    async with db_pool.acquire() as conn:
        await instance_actions.start(conn, RequestContext(), instance_uuid, "delete")

    await conductor.instance_deleted(RequestContext(), instance_uuid)
    await conductor.instance_deleted(RequestContext(), instance_uuid)

    async def gone() -> asyncpg.Record | None:
        async with db_pool.acquire() as conn:
            return await conn.fetchrow(
                """SELECT i.vm_state, a.finish_time FROM instances i
                     JOIN instance_actions a ON a.instance_uuid = i.uuid AND a.action = 'delete'
                    WHERE i.uuid = $1 AND i.deleted_at IS NOT NULL
                      AND a.finish_time IS NOT NULL""",
                instance_uuid,
            )

    row = await eventually(gone)
    assert row["vm_state"] == "deleted"
    assert await held(db_pool, instance_uuid) == 0
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
    assert node.memory_mb_used == 0


async def _some(items: Sequence[object]) -> bool | None:
    return True if items else None


async def test_a_build_to_a_requested_host_delivered_twice_at_once_claims_there_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    roomy = await register(conductor, "roomy", memory_mb=8192)
    asked = await register(conductor, "asked", memory_mb=2048)
    agents = {name: StandInCompute(conductor) for name in ("roomy", "asked")}
    await serve_stand_in(agent_transport, roomy, agents["roomy"])
    await serve_stand_in(agent_transport, asked, agents["asked"])
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, asked.node_uuid)
    instance_uuid = await create_instance(db_pool)
    request = BuildInstances(
        instance_uuid=instance_uuid,
        requested_destination=RequestedDestination(host="asked", node_ids=[node.id]),
    )
    managers = [
        ConductorManager(
            db_pool,
            SchedulerAPI(agent_transport, timeout=10),
            ComputeAPI(agent_transport, timeout=10),
            service_down_time=60,
        )
        for _ in range(2)
    ]
    await asyncio.gather(*(m.build_instances(RequestContext(), request) for m in managers))

    built = await settled(db_pool, instance_uuid, "active")
    assert built.host == "asked"
    # Both deliveries may send the build on (the agent builds once however often it is
    # asked); each went to the requested host only.
    assert {spec.uuid for spec in agents["asked"].built} == {instance_uuid}
    assert agents["roomy"].built == []
    assert await held(db_pool, instance_uuid) == 1
    async with db_pool.acquire() as conn:
        spec = await conn.fetchval(
            "SELECT spec FROM request_specs WHERE instance_uuid = $1", instance_uuid
        )
    assert "requested_destination" not in spec


async def test_every_build_delivery_carries_the_servers_copy_token(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "token-host")
    agent = StandInCompute(conductor)
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)

    await asyncio.gather(
        conductor.build_instances(RequestContext(), instance_uuid),
        conductor.build_instances(RequestContext(), instance_uuid),
    )
    instance = await settled(db_pool, instance_uuid, "active")

    assert instance.copy_token is not None
    assert {spec.origin for spec in agent.built} == {instance.copy_token}


async def test_a_guest_carrying_the_current_token_is_adopted_never_abandoned(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 16: one delivery's failure put the build in ERROR while another delivery's
    guest runs; a third delivery asking is told to build (report it), not to discard it,
    and its success makes the server ACTIVE with its claim."""
    registration = await register(conductor, "adopt-host")
    agent = StandInCompute(conductor)
    agent.report = False
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until(lambda: _sent(agent, instance_uuid))
    token = agent.built[0].origin
    ctx = RequestContext()
    await conductor.instance_build_result(ctx, instance_uuid, success=False, message="failed")
    await settled(db_pool, instance_uuid, "error")

    stranger = CopyToken(token=uuid.uuid4())
    checks = await asyncio.gather(
        conductor.check_build(ctx, instance_uuid, registration.node_uuid, CopyToken(token=token)),
        conductor.check_build(ctx, instance_uuid, registration.node_uuid, stranger),
        conductor.check_build(ctx, instance_uuid, registration.node_uuid),
    )
    assert [c.verdict if c else None for c in checks] == [
        BuildVerdict.BUILD,
        BuildVerdict.ABANDON,
        BuildVerdict.ABANDON,
    ]

    await conductor.instance_build_result(
        ctx, instance_uuid, success=True, built=CopyToken(token=token)
    )
    instance = await settled(db_pool, instance_uuid, "active")
    assert await held(db_pool, instance_uuid) == 1
    assert instance.copy_token == token


async def test_an_agent_too_old_to_name_its_copy_is_told_to_leave_a_failed_builds_guest(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Finding 27: an agent of a release before copy tokens asks about a build that failed
    (ERROR): it cannot say whether a guest it has is another delivery's, whose success is
    on its way, so it is told to leave it — never to remove it. An agent that names no
    guest at today's release is still told to abandon the build."""
    registration = await register(conductor, "old-agent-host")
    agent = StandInCompute(conductor)
    agent.report = False
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until(lambda: _sent(agent, instance_uuid))
    ctx = RequestContext()
    await conductor.instance_build_result(ctx, instance_uuid, success=False, message="failed")
    await settled(db_pool, instance_uuid, "error")
    current = await conductor.check_build(ctx, instance_uuid, registration.node_uuid)
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET version = $2
                WHERE id = (SELECT service_id FROM compute_nodes WHERE uuid = $1)""",
            registration.node_uuid,
            COPY_TOKENS_VERSION - 1,
        )

    checks = await asyncio.gather(
        conductor.check_build(ctx, instance_uuid, registration.node_uuid),
        conductor.check_build(ctx, instance_uuid, registration.node_uuid),
    )

    assert current is not None
    assert current.verdict is BuildVerdict.ABANDON
    assert [c.verdict if c else None for c in checks] == [BuildVerdict.LEAVE] * 2


async def test_a_build_result_for_a_copy_that_is_not_current_changes_nothing(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    registration = await register(conductor, "stale-host")
    agent = StandInCompute(conductor)
    agent.report = False
    await serve_stand_in(agent_transport, registration, agent)
    instance_uuid = await create_instance(db_pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until(lambda: _sent(agent, instance_uuid))

    await conductor.instance_build_result(
        RequestContext(), instance_uuid, success=True, built=CopyToken(token=uuid.uuid4())
    )
    await asyncio.sleep(0.5)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state) == ("building", "spawning")


def _sent(agent: StandInCompute, instance_uuid: UUID) -> bool:
    return any(spec.uuid == instance_uuid for spec in agent.built)


async def spawning_on(pool: asyncpg.Pool, conductor: ConductorAPI, host: str) -> Instance:
    """A new server placed on ``host``'s node and spawning there (its claim aside)."""
    registration = await register(conductor, host)
    instance_uuid = await create_instance(pool)
    async with pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, registration.node_uuid)
        placed = await instances.set_scheduled(
            conn, instance_uuid, host=host, node=node.hypervisor_hostname, compute_id=node.id
        )
    assert placed is not None
    return placed


async def test_a_success_delivered_twice_at_once_makes_the_server_active_and_closes_its_action_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    placed = await spawning_on(db_pool, conductor, "twice-result-host")
    result = InstanceBuildResult(
        instance_uuid=placed.uuid, success=True, built=CopyToken(token=placed.copy_token)
    )

    outcomes = await asyncio.gather(
        instance_events.record_build_result(db_pool, result),
        instance_events.record_build_result(db_pool, result),
    )

    assert sorted(o is None for o in outcomes) == [False, True]
    async with db_pool.acquire() as conn:
        after = await instances.get(conn, placed.uuid)
        actions = await conn.fetch(
            "SELECT result, message, finish_time FROM instance_actions"
            " WHERE instance_uuid = $1 AND action = 'create'",
            placed.uuid,
        )
    assert (after.vm_state, after.task_state) == ("active", None)
    assert [(a["result"], a["message"]) for a in actions] == [("Success", None)]
    assert actions[0]["finish_time"] is not None


async def test_a_success_for_a_server_deleted_while_it_spawned_leaves_its_action_open(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    placed = await spawning_on(db_pool, conductor, "deleted-result-host")
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET deleted_at = now() WHERE uuid = $1", placed.uuid)

    recorded = await instance_events.record_build_result(
        db_pool,
        InstanceBuildResult(
            instance_uuid=placed.uuid, success=True, built=CopyToken(token=placed.copy_token)
        ),
    )

    assert recorded is None
    async with db_pool.acquire() as conn:
        after = await instances.find(conn, placed.uuid)
    action = await create_action(db_pool, placed.uuid)
    assert after is not None
    assert after.vm_state == "building"
    assert action["finish_time"] is None


async def build_outcome(pool: asyncpg.Pool, instance_uuid: UUID) -> tuple[object, ...]:
    """What a build result decides: the server's states, its claims, its create action."""
    async with pool.acquire() as conn:
        instance = await instances.find(conn, instance_uuid)
        action = await conn.fetchrow(
            "SELECT result, message FROM instance_actions"
            " WHERE instance_uuid = $1 AND action = 'create'",
            instance_uuid,
        )
    assert instance is not None
    assert action is not None
    return (
        instance.vm_state,
        instance.task_state,
        await held(pool, instance_uuid),
        action["result"],
        action["message"],
    )


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
@pytest.mark.parametrize("success", [True, False], ids=["success", "failure"])
async def test_a_build_result_whose_database_call_fails_once_ends_the_same_when_delivered_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, success: bool, answered: bool
) -> None:
    after = (
        ("active", None, 1, "Success", None)
        if success
        else ("error", None, 0, "Error", "the disk image was unreadable")
    )
    counter = iter(range(1000))

    async def scenario(at: int) -> FailsOnce:
        host = f"flaky-result-{success}-{answered}-{next(counter)}"
        placed = await spawning_on(db_pool, conductor, host)
        assert placed.compute_id is not None
        async with db_pool.acquire() as conn:
            assert await allocations.claim(conn, placed.compute_id, placed.uuid, SMALL)
        before = await build_outcome(db_pool, placed.uuid)
        result = InstanceBuildResult(
            instance_uuid=placed.uuid,
            success=success,
            message="" if success else "the disk image was unreadable",
            built=CopyToken(token=placed.copy_token),
        )
        flaky = FailsOnce(db_pool, at, answered=answered)
        try:
            await instance_events.record_build_result(flaky.as_pool(), result)
        except asyncpg.ConnectionDoesNotExistError:
            assert flaky.failed
            assert await build_outcome(db_pool, placed.uuid) in (before, after), flaky.calls
        else:
            assert not flaky.failed, flaky.calls

        # Delivered again, and twice at the same time.
        await asyncio.gather(
            instance_events.record_build_result(db_pool, result),
            instance_events.record_build_result(db_pool, result),
        )
        assert await build_outcome(db_pool, placed.uuid) == after, flaky.calls
        return flaky

    calls = await every_call(scenario)
    assert calls >= 2


async def test_a_success_arriving_under_an_evacuation_of_the_failed_build_claims_its_node(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    """Finding 54: one delivery's failure put the build in ERROR (its claim released)
    while another delivery's guest ran; that guest's success arrives while the server is
    being evacuated. The server's state is the evacuation's to settle, but the guest runs
    on the server's node, so its claim there is recorded again, once however often the
    success comes; a success for another copy claims nothing."""
    placed = await spawning_on(db_pool, conductor, "evacuated-twice-built-host")
    assert placed.compute_id is not None
    async with db_pool.acquire() as conn:
        assert await allocations.claim(conn, placed.compute_id, placed.uuid, SMALL)
    failed = InstanceBuildResult(instance_uuid=placed.uuid, success=False, message="failed")
    assert await instance_events.record_build_result(db_pool, failed) is not None
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET task_state = 'rebuilding' WHERE uuid = $1", placed.uuid
        )
    assert await held(db_pool, placed.uuid) == 0

    stale = InstanceBuildResult(
        instance_uuid=placed.uuid, success=True, built=CopyToken(token=uuid.uuid4())
    )
    await instance_events.record_build_result(db_pool, stale)
    assert await held(db_pool, placed.uuid) == 0

    success = InstanceBuildResult(
        instance_uuid=placed.uuid, success=True, built=CopyToken(token=placed.copy_token)
    )
    await asyncio.gather(
        instance_events.record_build_result(db_pool, success),
        instance_events.record_build_result(db_pool, success),
    )
    async with db_pool.acquire() as conn:
        after = await instances.get(conn, placed.uuid)
        claims = await allocations.for_instance(conn, placed.uuid)
    assert (after.vm_state, after.task_state) == ("error", "rebuilding")
    assert [c.compute_node_id for c in claims] == [placed.compute_id]
