"""A delete's mark and its withdrawal, on PostgreSQL: what is given back is what the mark
replaced (finding 50), only while the server is still in the state it marked (finding 44), and
only while the request behind that task is still open (finding 51)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from shared.context import RequestContext
from shared.db import instance_actions, instances
from shared.objects.instance import Instance
from shared.objects.states import TaskState, VmState
from tests.functional.services.conductor.stand_in import create_instance

pytestmark = pytest.mark.functional


async def _in(pool: asyncpg.Pool, vm: VmState, task: TaskState) -> Instance:
    server = await create_instance(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = $2, task_state = $3 WHERE uuid = $1",
            server,
            vm.value,
            task.value,
        )
        return await instances.get(conn, server)


async def test_the_mark_returns_the_task_it_replaced_and_the_withdrawal_gives_it_back(
    db_pool: asyncpg.Pool,
) -> None:
    read = await _in(db_pool, VmState.ACTIVE, TaskState.RESIZE_PREP)
    async with db_pool.acquire() as conn:
        # The resize moved on after the delete read the server.
        await conn.execute(
            "UPDATE instances SET task_state = $2 WHERE uuid = $1",
            read.uuid,
            TaskState.RESIZE_MIGRATING.value,
        )
        before = await instances.mark_deleting(conn, read.uuid)
        assert before is not None
        assert before.task_state == TaskState.RESIZE_MIGRATING
        assert (await instances.get(conn, read.uuid)).task_state == TaskState.DELETING

        back = await instances.undo_deleting(
            conn, read.uuid, found=before, task=TaskState.RESIZE_MIGRATING
        )
    assert back is not None
    assert back.task_state == TaskState.RESIZE_MIGRATING


async def test_a_withdrawal_gives_no_task_back_to_a_server_that_left_the_marked_state(
    db_pool: asyncpg.Pool,
) -> None:
    building = await _in(db_pool, VmState.BUILDING, TaskState.SPAWNING)
    async with db_pool.acquire() as conn:
        before = await instances.mark_deleting(conn, building.uuid)
        assert before is not None
        # Its build ended under the mark: active, still deleting.
        active = await instances.set_active(conn, building.uuid)
        assert active is not None
        assert (active.vm_state, active.task_state) == (VmState.ACTIVE, TaskState.DELETING)

        back = await instances.undo_deleting(
            conn, building.uuid, found=before, task=TaskState.SPAWNING
        )
    assert back is not None
    assert (back.vm_state, back.task_state) == (VmState.ACTIVE, None)


async def test_two_marks_at_once_each_see_what_the_other_left(db_pool: asyncpg.Pool) -> None:
    """Two deletes at once: the row lock orders them; the second sees the first's mark."""
    read = await _in(db_pool, VmState.ACTIVE, TaskState.POWERING_OFF)

    async def mark() -> str | None:
        async with db_pool.acquire() as conn, conn.transaction():
            before = await instances.mark_deleting(conn, read.uuid)
            assert before is not None
            return before.task_state

    found = await asyncio.gather(mark(), mark())
    assert sorted(found, key=str) == sorted(
        [TaskState.POWERING_OFF.value, TaskState.DELETING.value], key=str
    )


async def test_a_request_ending_while_a_withdrawal_looks_is_waited_for_and_seen_ended(
    db_pool: asyncpg.Pool,
) -> None:
    """Finding 51, at once: a move's withdrawal ends its record while a withdrawn delete
    asks whether the request behind the task it found is still open. The delete waits
    for the move's transaction and sees the record ended, so gives no task back."""
    read = await _in(db_pool, VmState.ACTIVE, TaskState.RESIZE_PREP)
    async with db_pool.acquire() as conn:
        await instance_actions.finish(conn, read.uuid, "create")
        await instance_actions.start(conn, RequestContext(request_id="move"), read.uuid, "migrate")
    async with db_pool.acquire() as mover, db_pool.acquire() as deleter:
        ending = mover.transaction()
        await ending.start()
        await instance_actions.finish(mover, read.uuid, "migrate", "its cast was lost")
        async with deleter.transaction():
            looking = asyncio.create_task(
                instance_actions.lock_others_open(deleter, read.uuid, "delete")
            )
            await asyncio.sleep(0.2)
            waited = not looking.done()
            await ending.commit()
            still_open = await looking
    assert waited
    assert not still_open
