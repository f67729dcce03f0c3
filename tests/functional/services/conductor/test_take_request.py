"""A request keel-api sent is taken by its agent or withdrawn by keel-api, never both.

keel-api withdraws a stop (or start, reboot, delete...) whose message it could not
confirm sent, and answers 503; the message may still reach the agent, which takes the
request (conductor RPC ``take_request``) before acting on it. Real RabbitMQ and
PostgreSQL: the takes go through a running keel-conductor, the withdrawals are keel-api's
own code.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.api.servers import power
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import instance_actions, instances
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import create_instance, until_active
from tests.functional.services.conductor.test_migrations import host

pytestmark = pytest.mark.functional


async def stopping(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport, name: str
) -> tuple[UUID, RequestContext]:
    """An ACTIVE server on a stand-in host whose stop keel-api has recorded (not sent)."""
    await host(conductor, transport, name)
    instance_uuid = await create_instance(pool)
    await conductor.build_instances(RequestContext(), instance_uuid)
    await until_active(pool, instance_uuid)
    ctx = RequestContext(user_id="u", project_id="p")
    async with pool.acquire() as conn, conn.transaction():
        assert await instances.begin_task(
            conn, instance_uuid, TaskState.POWERING_OFF, vm_states=(VmState.ACTIVE,)
        )
        await instance_actions.start(conn, ctx, instance_uuid, "stop")
    return instance_uuid, ctx


async def withdraw(pool: asyncpg.Pool, ctx: RequestContext, instance_uuid: UUID) -> bool:
    return await power._withdraw(pool, ctx, instance_uuid, power.STOP, "lost (test)")


async def stop_action(
    pool: asyncpg.Pool, instance_uuid: UUID, ctx: RequestContext
) -> asyncpg.Record:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT * FROM instance_actions WHERE instance_uuid = $1 AND request_id = $2",
            instance_uuid,
            ctx.request_id,
        )
    assert row is not None
    return row


async def test_a_request_taken_twice_at_once_is_taken_and_cannot_be_withdrawn(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, ctx = await stopping(db_pool, conductor, agent_transport, "take-twice")

    answers = await asyncio.gather(
        conductor.take_request(ctx, instance_uuid), conductor.take_request(ctx, instance_uuid)
    )

    assert list(answers) == [True, True]
    assert not await withdraw(db_pool, ctx, instance_uuid)
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert instance.task_state == TaskState.POWERING_OFF
    action = await stop_action(db_pool, instance_uuid, ctx)
    assert action["taken_at"] is not None
    assert action["withdrawn_at"] is None


async def test_a_withdrawn_request_is_not_taken_by_a_message_that_arrives_later(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    instance_uuid, ctx = await stopping(db_pool, conductor, agent_transport, "take-late")

    assert await withdraw(db_pool, ctx, instance_uuid)

    assert await conductor.take_request(ctx, instance_uuid) is False
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
    assert (instance.vm_state, instance.task_state) == (VmState.ACTIVE, None)
    action = await stop_action(db_pool, instance_uuid, ctx)
    assert (action["result"], action["message"]) == ("Error", "lost (test)")
    assert action["taken_at"] is None


async def test_a_take_and_a_withdrawal_racing_never_both_win(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    for round_ in range(6):
        instance_uuid, ctx = await stopping(db_pool, conductor, agent_transport, f"race-{round_}")
        taken, withdrawn = await asyncio.gather(
            conductor.take_request(ctx, instance_uuid), withdraw(db_pool, ctx, instance_uuid)
        )
        assert taken != withdrawn, (round_, taken, withdrawn)
        action = await stop_action(db_pool, instance_uuid, ctx)
        assert (action["taken_at"] is not None) == taken
        assert (action["withdrawn_at"] is not None) == withdrawn


async def test_work_no_request_recorded_is_always_taken(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """A message a service sent on its own (the move deadline's stop) has no record."""
    instance_uuid, _ = await stopping(db_pool, conductor, agent_transport, "take-internal")

    assert await conductor.take_request(RequestContext.internal(), instance_uuid) is True
