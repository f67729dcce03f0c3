"""The conductor ends a snapshot as its agent reports it, on real PostgreSQL, however the
database call that handles the report fails.

A snapshot result is a cast: when one of its database calls fails (the connection
dropped before the statement or the commit reached PostgreSQL, or after the commit took
effect but before its answer came back), the message is delivered again. Every such
call fails in turn; after the fault the server and its image are as before the report
or as after it, never between, and once delivered again the task has ended once, the
server is as it was and the image is ``active`` (success) or killed (failure).
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from services.conductor import instance_events
from services.conductor.instance_events import SNAPSHOT_ACTION
from services.conductor.rpcapi import InstanceActionResult, PowerAction
from shared.context import RequestContext
from shared.db import instance_actions, instances, snapshots
from shared.objects.states import TaskState, VmState
from tests.functional.faults import FailsOnce, every_call
from tests.functional.services.conductor.stand_in import create_instance

pytestmark = pytest.mark.functional

CTX = RequestContext(user_id="u", project_id="p")
DATA_SIZE = 65536


async def snapshotting(pool: asyncpg.Pool, *, uploaded: bool) -> tuple[UUID, UUID]:
    """An ACTIVE server taking a snapshot, as keel-api began it and (``uploaded``) its
    agent wrote the image: ``(server, image)``."""
    instance_uuid = await create_instance(pool)
    image_id = uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            """UPDATE instances SET vm_state = 'active', task_state = NULL, power_state = 1
                WHERE uuid = $1""",
            instance_uuid,
        )
        begun = await snapshots.begin(
            conn,
            instance_uuid,
            image_id=image_id,
            name="snap",
            owner="p",
            disk_format="qcow2",
            min_disk=1,
            min_ram=0,
            properties={"image_type": "snapshot", "instance_uuid": str(instance_uuid)},
        )
        assert begun is not None
        await instance_actions.start(conn, CTX, instance_uuid, SNAPSHOT_ACTION)
        if uploaded:
            assert await snapshots.advance(conn, instance_uuid, TaskState.IMAGE_UPLOADING)
            await conn.execute(
                "UPDATE images SET status = 'active', size = $2 WHERE id = $1",
                image_id,
                DATA_SIZE,
            )
    return instance_uuid, image_id


async def outcome(pool: asyncpg.Pool, instance_uuid: UUID, image_id: UUID) -> tuple[Any, ...]:
    """The server's vm and task states, its image's status and size, whether the image is
    deleted, and its finished ``createImage`` actions' messages."""
    async with pool.acquire() as conn:
        instance = await instances.get(conn, instance_uuid)
        image = await conn.fetchrow(
            "SELECT status, size, deleted_at IS NOT NULL AS gone FROM images WHERE id = $1",
            image_id,
        )
        finished = await conn.fetch(
            """SELECT message FROM instance_actions
                WHERE instance_uuid = $1 AND action = $2 AND finish_time IS NOT NULL""",
            instance_uuid,
            SNAPSHOT_ACTION,
        )
    assert image is not None
    return (
        instance.vm_state,
        instance.task_state,
        image["status"],
        image["size"],
        image["gone"],
        [row["message"] for row in finished],
    )


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
@pytest.mark.parametrize("success", [True, False], ids=["done", "failed"])
async def test_a_snapshot_result_whose_database_call_fails_once_ends_it_when_delivered_again(
    db_pool: asyncpg.Pool, success: bool, answered: bool
) -> None:
    after: tuple[Any, ...]
    if success:
        after = (VmState.ACTIVE, None, "active", DATA_SIZE, False, [None])
    else:
        after = (VmState.ACTIVE, None, "killed", None, True, ["qemu-img failed"])

    async def scenario(at: int) -> FailsOnce:
        instance_uuid, image_id = await snapshotting(db_pool, uploaded=success)
        before = await outcome(db_pool, instance_uuid, image_id)
        result = InstanceActionResult(
            instance_uuid=instance_uuid,
            action=PowerAction.SNAPSHOT,
            success=success,
            message="" if success else "qemu-img failed",
        )
        flaky = FailsOnce(db_pool, at, answered=answered)
        try:
            await instance_events.record_action_result(flaky.as_pool(), result)
        except asyncpg.ConnectionDoesNotExistError:
            assert flaky.failed
            assert await outcome(db_pool, instance_uuid, image_id) in (before, after), flaky.calls
        else:
            assert not flaky.failed, flaky.calls

        # Delivered again, and (at least once) twice at the same time.
        await asyncio.gather(
            instance_events.record_action_result(db_pool, result),
            instance_events.record_action_result(db_pool, result),
        )
        assert await outcome(db_pool, instance_uuid, image_id) == after, flaky.calls
        return flaky

    calls = await every_call(scenario)
    # Acquire, two statements or more, the commit; only the commit's answer matters.
    assert calls >= (1 if answered else 4)
