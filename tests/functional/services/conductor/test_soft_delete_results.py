"""The conductor ends soft delete and restore tasks as agents report them.

On real RabbitMQ and PostgreSQL through a running keel-conductor: each result is a
compare-and-swap on the task keel-api set, so a result delivered twice at once ends the
task once, and the reclaim's clock is stamped once and cleared by a restore.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from services.conductor.rpcapi import ConductorAPI, GuestFate, PowerAction
from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, instances
from shared.objects.states import PowerState, TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.conductor.stand_in import create_instance, eventually
from tests.functional.services.conductor.test_deadlines import placed_on_a

pytestmark = pytest.mark.functional

CTX = RequestContext(user_id="u", project_id="p")

#: action → (vm state before, task keel-api set, its action record, vm state after).
CASES = {
    PowerAction.SOFT_DELETE: (
        VmState.ACTIVE,
        TaskState.SOFT_DELETING,
        "delete",
        VmState.SOFT_DELETED,
    ),
    PowerAction.RESTORE: (VmState.SOFT_DELETED, TaskState.RESTORING, "restore", VmState.ACTIVE),
}


async def in_task(pool: asyncpg.Pool, action: PowerAction) -> UUID:
    before, task, record, _ = CASES[action]
    instance_uuid = await create_instance(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET vm_state = $2, task_state = NULL,
                      soft_deleted_at = CASE WHEN $2 = 'soft-delete' THEN now() END
                WHERE uuid = $1""",
            instance_uuid,
            before.value,
        )
        started = await instances.begin_task(conn, instance_uuid, task, vm_states=[before])
        assert started is not None
        await instance_actions.start(conn, CTX, instance_uuid, record)
    return instance_uuid


async def outcome(pool: asyncpg.Pool, instance_uuid: UUID, record: str) -> tuple[Any, ...]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            """SELECT vm_state, task_state, power_state, soft_deleted_at FROM instances
                WHERE uuid = $1""",
            instance_uuid,
        )
        finished = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = $2 AND finish_time IS NOT NULL""",
            instance_uuid,
            record,
        )
    assert row is not None
    return row["vm_state"], row["task_state"], row["power_state"], row["soft_deleted_at"], finished


async def test_a_soft_delete_result_twice_at_once_soft_deletes_once(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    instance_uuid = await in_task(db_pool, PowerAction.SOFT_DELETE)

    await asyncio.gather(
        *(
            conductor.instance_action_result(
                CTX, instance_uuid, PowerAction.SOFT_DELETE, success=True
            )
            for _ in "ab"
        )
    )

    async def ended() -> tuple[Any, ...] | None:
        state = await outcome(db_pool, instance_uuid, "delete")
        return state if state[1] is None else None

    vm_state, _, power, stamped, finished = await eventually(ended)
    assert (vm_state, power, finished) == ("soft-delete", PowerState.SHUTDOWN.value, 1)
    assert isinstance(stamped, datetime)
    await asyncio.sleep(0.2)  # the second delivery, if handled late, changes nothing
    assert (await outcome(db_pool, instance_uuid, "delete"))[3] == stamped


async def test_a_restore_result_twice_at_once_restores_once_and_stops_the_clock(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    instance_uuid = await in_task(db_pool, PowerAction.RESTORE)

    await asyncio.gather(
        *(
            conductor.instance_action_result(CTX, instance_uuid, PowerAction.RESTORE, success=True)
            for _ in "ab"
        )
    )

    expected = ("active", None, PowerState.RUNNING.value, None, 1)

    async def ended() -> bool | None:
        return True if await outcome(db_pool, instance_uuid, "restore") == expected else None

    await eventually(ended)


async def test_a_failed_soft_delete_leaves_the_server_as_it_was_with_the_reason(
    db_pool: asyncpg.Pool, conductor: ConductorAPI
) -> None:
    instance_uuid = await in_task(db_pool, PowerAction.SOFT_DELETE)

    await conductor.instance_action_result(
        CTX, instance_uuid, PowerAction.SOFT_DELETE, success=False, message="stuck (test)"
    )

    async def ended() -> tuple[Any, ...] | None:
        state = await outcome(db_pool, instance_uuid, "delete")
        return state if state[1] is None else None

    vm_state, _, _, stamped, finished = await eventually(ended)
    assert (vm_state, stamped, finished) == ("active", None, 1)
    async with db_pool.acquire() as conn:
        message = await conn.fetchval(
            """SELECT message FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'delete'""",
            instance_uuid,
        )
    assert message == "stuck (test)"


async def test_a_guest_report_keeps_a_soft_deleted_servers_guest_and_its_state(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """The guest of a SOFT_DELETED server is the server's own: kept (never removed as a
    deleted server's, nor recorded as an orphan), and whatever power its host reports,
    the server stays SOFT_DELETED (its recorded state does not follow the guest)."""
    instance_uuid, node_id, _ = await placed_on_a(db_pool, conductor, agent_transport, "soft")
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET vm_state = 'soft-delete', power_state = $2,
                      soft_deleted_at = now() - interval '1 hour',
                      updated_at = now() - interval '1 hour'
                WHERE uuid = $1""",
            instance_uuid,
            PowerState.SHUTDOWN.value,
        )
        node = await compute_nodes.get_by_id(conn, node_id)
    ctx = RequestContext()

    reports = await asyncio.gather(
        *(
            conductor.report_guests(
                ctx, node.uuid, [instance_uuid], {instance_uuid: PowerState.RUNNING}
            )
            for _ in "ab"
        )
    )

    for report in reports:
        assert report is not None
        assert [(v.instance_uuid, v.fate) for v in report.verdicts] == [
            (instance_uuid, GuestFate.KEEP)
        ]
    async with db_pool.acquire() as conn:
        kept = await instances.get(conn, instance_uuid)
        orphaned = await conn.fetchval(
            "SELECT count(*) FROM orphaned_guests WHERE instance_uuid = $1", instance_uuid
        )
    assert (kept.vm_state, kept.power_state) == ("soft-delete", PowerState.SHUTDOWN.value)
    assert orphaned == 0
