"""The conductor ends pause, unpause, suspend and resume tasks as agents report them.

On real RabbitMQ and PostgreSQL: each result is a compare-and-swap on the task the API
set, so a result delivered twice at once, or handled again after its database call
failed, ends the task once.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from services.conductor import instance_events
from services.conductor.rpcapi import ConductorAPI, InstanceActionResult, PowerAction
from shared.context import RequestContext
from shared.db import instance_actions, instances
from shared.objects.states import PowerState, TaskState, VmState
from tests.functional.faults import FailsOnce
from tests.functional.services.conductor.stand_in import create_instance, eventually

pytestmark = pytest.mark.functional

CTX = RequestContext(user_id="u", project_id="p")

#: action → (vm state before, task the API set, vm state and power state after).
CASES = {
    PowerAction.PAUSE: (VmState.ACTIVE, TaskState.PAUSING, VmState.PAUSED, PowerState.PAUSED),
    PowerAction.UNPAUSE: (VmState.PAUSED, TaskState.UNPAUSING, VmState.ACTIVE, PowerState.RUNNING),
    PowerAction.SUSPEND: (
        VmState.ACTIVE,
        TaskState.SUSPENDING,
        VmState.SUSPENDED,
        PowerState.SHUTDOWN,
    ),
    PowerAction.RESUME: (VmState.SUSPENDED, TaskState.RESUMING, VmState.ACTIVE, PowerState.RUNNING),
}


async def in_task(pool: asyncpg.Pool, action: PowerAction) -> UUID:
    """An instance in the task the API sets for ``action``, with its action record."""
    before, task, _, _ = CASES[action]
    instance_uuid = await create_instance(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = $2, task_state = NULL WHERE uuid = $1",
            instance_uuid,
            before.value,
        )
        started = await instances.begin_task(conn, instance_uuid, task, vm_states=[before])
        assert started is not None
        await instance_actions.start(conn, CTX, instance_uuid, action.value)
    return instance_uuid


async def outcome(pool: asyncpg.Pool, instance_uuid: UUID, action: PowerAction) -> tuple[Any, ...]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT vm_state, task_state, power_state FROM instances WHERE uuid = $1",
            instance_uuid,
        )
        finished = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = $2 AND finish_time IS NOT NULL""",
            instance_uuid,
            action.value,
        )
    assert row is not None
    return row["vm_state"], row["task_state"], row["power_state"], finished


@pytest.mark.parametrize("action", list(CASES))
async def test_a_result_delivered_twice_at_once_ends_the_task_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, action: PowerAction
) -> None:
    instance_uuid = await in_task(db_pool, action)
    await asyncio.gather(
        *(conductor.instance_action_result(CTX, instance_uuid, action, success=True) for _ in "ab")
    )
    _, _, vm_state, power_state = CASES[action]
    expected = (vm_state.value, None, power_state.value, 1)

    async def ended() -> bool | None:
        return True if await outcome(db_pool, instance_uuid, action) == expected else None

    await eventually(ended)


async def test_a_result_whose_database_call_failed_once_ends_the_task_when_handled_again(
    db_pool: asyncpg.Pool,
) -> None:
    instance_uuid = await in_task(db_pool, PowerAction.SUSPEND)
    result = InstanceActionResult(
        instance_uuid=instance_uuid, action=PowerAction.SUSPEND, success=True
    )
    flaky = FailsOnce(db_pool).as_pool()
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        await instance_events.record_action_result(flaky, result)
    assert (await outcome(db_pool, instance_uuid, PowerAction.SUSPEND))[:2] == (
        "active",
        "suspending",
    )
    await instance_events.record_action_result(flaky, result)
    await instance_events.record_action_result(db_pool, result)
    assert await outcome(db_pool, instance_uuid, PowerAction.SUSPEND) == (
        "suspended",
        None,
        PowerState.SHUTDOWN.value,
        1,
    )


async def test_a_failed_pause_leaves_the_server_active_with_the_reason(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    instance_uuid = await in_task(db_pool, PowerAction.PAUSE)
    await conductor.instance_action_result(
        CTX, instance_uuid, PowerAction.PAUSE, success=False, message="the monitor was busy"
    )

    async def ended() -> bool | None:
        state = await outcome(db_pool, instance_uuid, PowerAction.PAUSE)
        return True if state[1] is None else None

    await eventually(ended)
    assert (await outcome(db_pool, instance_uuid, PowerAction.PAUSE))[0] == "active"
