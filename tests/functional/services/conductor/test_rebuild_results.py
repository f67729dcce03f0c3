"""A rebuild's request, result, withdrawal and deadline, on real RabbitMQ and PostgreSQL.

The agent takes a rebuild only while it is under way on its own node; the conductor
ends it once however often the result arrives; keel-api's withdrawal puts every field
back; the task deadline ends a rebuild nobody finished in ERROR.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from services.api.servers import rebuild
from services.conductor import instance_events
from services.conductor.deadlines import TaskDeadline
from services.conductor.rpcapi import ConductorAPI, InstanceActionResult, PowerAction
from shared.context import RequestContext
from shared.db import instance_actions, instances, rebuilds
from shared.db.rebuilds import RebuildChange
from shared.objects.instance import Instance
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.faults import FailsOnce
from tests.functional.services.conductor.stand_in import (
    create_instance,
    eventually,
    until_active,
)
from tests.functional.services.conductor.test_migrations import host

pytestmark = pytest.mark.functional

NEW_IMAGE = "7b1d5e6a-0c44-4c1f-9a55-2f7e0d1c9b21"
CHANGE = RebuildChange(
    image_ref=NEW_IMAGE,
    display_name="renamed",
    metadata={"role": "db"},
    user_data=None,
    given=frozenset({"display_name", "metadata", "user_data"}),
)


async def rebuilding(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    transport: AmqpTransport,
    name: str,
    *,
    vm_state: VmState = VmState.ACTIVE,
) -> tuple[Instance, Instance, RequestContext]:
    """A server built on a stand-in host whose rebuild keel-api has recorded (not sent):
    ``(before, after, ctx)``."""
    await host(conductor, transport, name)
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE instances SET vm_state = $2, user_data = 'aGk=' WHERE uuid = $1",
            instance_uuid,
            vm_state.value,
        )
        begun = await rebuilds.begin(conn, instance_uuid, CHANGE)
        assert begun is not None
        await instance_actions.start(conn, ctx, instance_uuid, "rebuild")
    before, after = begun
    return before, after, ctx


async def node_of(pool: asyncpg.Pool, instance_uuid: UUID) -> UUID:
    async with pool.acquire() as conn:
        node: UUID = await conn.fetchval(
            """SELECT n.uuid FROM instances i JOIN compute_nodes n ON n.id = i.compute_id
                WHERE i.uuid = $1""",
            instance_uuid,
        )
    return node


async def shown(pool: asyncpg.Pool, instance_uuid: UUID) -> Instance:
    async with pool.acquire() as conn:
        return await instances.get(conn, instance_uuid)


async def take(conductor: ConductorAPI, ctx: RequestContext, instance: Instance, node: UUID) -> Any:
    return await conductor.take_request(
        ctx, instance.uuid, task=TaskState.REBUILD_SPAWNING.value, node_uuid=node
    )


async def test_begin_writes_the_new_fields_with_the_task_and_keeps_the_rest(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    before, after, _ = await rebuilding(db_pool, conductor, agent_transport, "rb-begin")

    assert (after.vm_state, after.task_state) == ("active", "rebuild_spawning")
    assert (after.image_ref, after.display_name, after.metadata) == (
        NEW_IMAGE,
        "renamed",
        {"role": "db"},
    )
    assert after.user_data is None
    assert (after.key_name, after.access_ip_v4, after.flavor) == (
        before.key_name,
        before.access_ip_v4,
        before.flavor,
    )
    async with db_pool.acquire() as conn:
        assert await rebuilds.begin(conn, before.uuid, CHANGE) is None  # a second: 409


async def test_the_agent_takes_a_rebuild_only_while_it_is_under_way_on_its_node(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    before, _, ctx = await rebuilding(db_pool, conductor, agent_transport, "rb-take")
    node = await node_of(db_pool, before.uuid)

    assert await take(conductor, ctx, before, uuid4()) is False  # another node
    assert list(
        await asyncio.gather(take(conductor, ctx, before, node), take(conductor, ctx, before, node))
    ) == [True, True]
    await conductor.instance_action_result(ctx, before.uuid, PowerAction.REBUILD, success=True)

    async def ended() -> Instance | None:
        instance = await shown(db_pool, before.uuid)
        return instance if instance.task_state is None else None

    await eventually(ended)
    # Delivered again after it ended: not taken, so the agent makes no other guest.
    assert await take(conductor, ctx, before, node) is False


@pytest.mark.parametrize(
    ("vm_state", "success", "expected"),
    [
        (VmState.ACTIVE, True, ("active", 1)),
        (VmState.STOPPED, True, ("stopped", 4)),
        (VmState.ERROR, True, ("active", 1)),
        (VmState.ACTIVE, False, ("error", 0)),
    ],
)
async def test_a_result_delivered_twice_at_once_ends_the_rebuild_once(
    db_pool: asyncpg.Pool,
    conductor: ConductorAPI,
    agent_transport: AmqpTransport,
    *,
    vm_state: VmState,
    success: bool,
    expected: tuple[str, int],
) -> None:
    name = f"rb-result-{vm_state.value}-{success}"
    before, _, ctx = await rebuilding(db_pool, conductor, agent_transport, name, vm_state=vm_state)
    message = "" if success else "the image could not be read"
    await asyncio.gather(
        *(
            conductor.instance_action_result(
                ctx, before.uuid, PowerAction.REBUILD, success=success, message=message
            )
            for _ in "ab"
        )
    )

    async def ended() -> Instance | None:
        instance = await shown(db_pool, before.uuid)
        return instance if instance.task_state is None else None

    instance = await eventually(ended)
    assert (instance.vm_state, int(instance.power_state)) == expected
    assert instance.image_ref == NEW_IMAGE
    if not success:
        assert instance.fault is not None
        assert "the image could not be read" in instance.fault.message
    async with db_pool.acquire() as conn:
        finished = await conn.fetch(
            """SELECT message FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'rebuild' AND finish_time IS NOT NULL""",
            before.uuid,
        )
    assert len(finished) == 1


async def test_a_result_whose_database_call_failed_once_ends_the_rebuild_when_handled_again(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    before, _, _ = await rebuilding(db_pool, conductor, agent_transport, "rb-result-flaky")
    result = InstanceActionResult(
        instance_uuid=before.uuid, action=PowerAction.REBUILD, success=True
    )
    flaky = FailsOnce(db_pool).as_pool()
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        await instance_events.record_action_result(flaky, result)
    assert (await shown(db_pool, before.uuid)).task_state == TaskState.REBUILD_SPAWNING
    await instance_events.record_action_result(flaky, result)
    await instance_events.record_action_result(db_pool, result)
    instance = await shown(db_pool, before.uuid)
    assert (instance.vm_state, instance.task_state, instance.image_ref) == (
        VmState.ACTIVE,
        None,
        NEW_IMAGE,
    )
    async with db_pool.acquire() as conn:
        finished = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'rebuild' AND finish_time IS NOT NULL""",
            before.uuid,
        )
    assert finished == 1


async def test_a_withdrawn_rebuild_puts_every_field_back_and_is_never_taken(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    before, _, ctx = await rebuilding(db_pool, conductor, agent_transport, "rb-withdraw")
    node = await node_of(db_pool, before.uuid)

    assert await rebuild._withdraw(db_pool, ctx, before, CHANGE, "lost (test)")

    instance = await shown(db_pool, before.uuid)
    assert (instance.vm_state, instance.task_state) == ("active", None)
    assert (instance.image_ref, instance.display_name, instance.metadata) == (
        before.image_ref,
        before.display_name,
        before.metadata,
    )
    assert instance.user_data == "aGk="
    assert await take(conductor, ctx, before, node) is False


async def test_a_take_and_a_withdrawal_racing_never_both_win(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    for round_ in range(4):
        before, _, ctx = await rebuilding(db_pool, conductor, agent_transport, f"rb-race-{round_}")
        node = await node_of(db_pool, before.uuid)
        taken, withdrawn = await asyncio.gather(
            take(conductor, ctx, before, node),
            rebuild._withdraw(db_pool, ctx, before, CHANGE, "lost (test)"),
        )
        assert taken != withdrawn, (round_, taken, withdrawn)
        instance = await shown(db_pool, before.uuid)
        assert (instance.image_ref == NEW_IMAGE) == taken


async def test_the_task_deadline_ends_an_unfinished_rebuild_in_error_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    before, _, _ = await rebuilding(db_pool, conductor, agent_transport, "rb-deadline")
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            before.uuid,
        )
    deadline = TaskDeadline(db_pool, timeout=60)

    swept = await asyncio.gather(deadline.sweep(), deadline.sweep())

    assert sorted(swept) == [0, 1]
    instance = await shown(db_pool, before.uuid)
    assert (instance.vm_state, instance.task_state) == ("error", None)
