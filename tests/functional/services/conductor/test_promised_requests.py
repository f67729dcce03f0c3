"""Deletes, soft deletes and restores keel-api promised: real RabbitMQ and PostgreSQL.

keel-api cannot withdraw a request an agent of an older release may have received, so it
answered that it would happen; and an agent down past the task timeout finds its
request still wanted when it is back. The conductor's sweep keeps those promises
(:mod:`services.conductor.promised_requests`). A stand-in agent does what reaches it;
sweeps run twice at once, as two conductors would run them.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import ComputeAPI
from services.conductor.deadlines import TaskDeadline
from services.conductor.promised_requests import PromisedRequests
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import instance_actions, instances
from shared.exceptions import InstanceNotFound, MessagingTimeout
from shared.objects.states import TaskState, VmState
from shared.rpc.amqp import AmqpTransport
from shared.versions import TAKING_REQUESTS_VERSION
from tests.functional.faults import FailsOnce, every_call
from tests.functional.services.conductor.conftest import SOON
from tests.functional.services.conductor.stand_in import eventually
from tests.functional.services.conductor.test_deadlines import placed_on_a

pytestmark = pytest.mark.functional

TIMEOUT = 600.0


async def deleting_past_its_deadline(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    transport: AmqpTransport,
    prefix: str,
    task: TaskState = TaskState.DELETING,
) -> UUID:
    """A server built on a stand-in agent, then marked ``task`` (``deleting``, or a soft
    delete's ``soft-deleting``) as keel-api marks it, an hour ago; its delete never
    reached the agent."""
    server, _, _ = await placed_on_a(pool, conductor, transport, prefix)
    async with pool.acquire() as conn:
        await instances.set_task_state(conn, server, task)
        await instance_actions.start(conn, RequestContext(user_id="u"), server, "delete")
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            server,
        )
    return server


async def agent_release(pool: asyncpg.Pool, server: UUID, version: int) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services s SET version = $2
                 FROM compute_nodes n, instances i
                WHERE i.uuid = $1 AND n.id = i.compute_id AND s.id = n.service_id""",
            server,
            version,
        )


def resender(pool: asyncpg.Pool, transport: AmqpTransport) -> PromisedRequests:
    compute = ComputeAPI(transport, timeout=SOON)
    return PromisedRequests(pool, compute, timeout=TIMEOUT, down_time=60)


async def task_of(pool: asyncpg.Pool, server: UUID) -> str | None:
    async with pool.acquire() as conn:
        return (await instances.get(conn, server)).task_state


async def gone(pool: asyncpg.Pool, server: UUID) -> bool | None:
    async with pool.acquire() as conn:
        try:
            await instances.get(conn, server)
        except InstanceNotFound:
            return True
    return None


async def test_a_delete_an_older_agent_never_got_is_sent_again_once_by_two_sweeps(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    server = await deleting_past_its_deadline(db_pool, conductor, agent_transport, "oad-sent")
    await agent_release(db_pool, server, TAKING_REQUESTS_VERSION - 1)

    # The task deadline leaves it: clearing it would make the 204 keel-api gave a lie.
    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    assert await task_of(db_pool, server) == TaskState.DELETING
    sent = await asyncio.gather(*(resender(db_pool, agent_transport).sweep() for _ in range(2)))

    assert sorted(sent) == [0, 1]
    assert await eventually(lambda: gone(db_pool, server))


async def test_a_delete_waits_while_the_older_agent_is_down(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    server = await deleting_past_its_deadline(db_pool, conductor, agent_transport, "oad-down")
    await agent_release(db_pool, server, TAKING_REQUESTS_VERSION - 1)
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE services s SET forced_down = true
                 FROM compute_nodes n, instances i
                WHERE i.uuid = $1 AND n.id = i.compute_id AND s.id = n.service_id""",
            server,
        )

    assert await resender(db_pool, agent_transport).sweep() == 0
    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    # Neither sent nor cleared: the delete may be in the agent's queue.
    assert await task_of(db_pool, server) == TaskState.DELETING


async def test_a_delete_an_agent_took_is_left_to_the_task_deadline(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Taken, the delete is the agent's (a redelivery finishes it): not sent again, and
    the task deadline clears the task as for any other."""
    server = await deleting_past_its_deadline(db_pool, conductor, agent_transport, "oad-took")
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instance_actions SET taken_at = now() WHERE instance_uuid = $1", server
        )

    assert await resender(db_pool, agent_transport).sweep() == 0
    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 1
    assert await task_of(db_pool, server) is None


async def test_an_untaken_delete_is_sent_again_after_its_agent_was_upgraded(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """The delete keel-api could not confirm to an older agent never left; the agent was
    upgraded since (it takes requests now). The task deadline still leaves the server,
    and the delete, sent again under its own request id, is taken and done."""
    server = await deleting_past_its_deadline(db_pool, conductor, agent_transport, "oad-upg")

    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    assert await resender(db_pool, agent_transport).sweep() == 1
    assert await eventually(lambda: gone(db_pool, server))


class LosingOnce(ComputeAPI):
    """Its first terminate is lost (the broker unreachable); later ones go out."""

    lost = 0

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        if self.lost == 0:
            self.lost += 1
            raise MessagingTimeout("the broker could not be reached")
        await super().terminate_instance(ctx, service_uuid, instance_uuid)


async def test_a_delete_whose_sending_again_fails_is_sent_at_the_next_timeout(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """The pass's own cast fails once: the server stays deleting, the next pass after
    the timeout sends it, and the agent deletes it."""
    server = await deleting_past_its_deadline(db_pool, conductor, agent_transport, "oad-lost")
    sweep = PromisedRequests(
        db_pool, LosingOnce(agent_transport, timeout=SOON), timeout=TIMEOUT, down_time=60
    )

    assert await sweep.sweep() == 1
    assert await task_of(db_pool, server) == TaskState.DELETING
    assert await sweep.sweep() == 0  # not before the timeout
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
            server,
        )
    assert await sweep.sweep() == 1
    assert await eventually(lambda: gone(db_pool, server))


async def test_a_soft_delete_no_agent_took_is_sent_again_and_never_cleared(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """A soft delete keel-api answered 204 for never reached the agent (or the agent was
    down past the timeout): the task deadline leaves ``soft-deleting`` (clearing it would
    leave the server running), and two sweeps at once send the soft delete once, which
    the agent carries out: the server is soft-deleted."""
    server = await deleting_past_its_deadline(
        db_pool, conductor, agent_transport, "oad-soft", TaskState.SOFT_DELETING
    )

    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    assert await task_of(db_pool, server) == TaskState.SOFT_DELETING
    sent = await asyncio.gather(*(resender(db_pool, agent_transport).sweep() for _ in range(2)))
    assert sorted(sent) == [0, 1]

    async def soft_deleted() -> bool | None:
        async with db_pool.acquire() as conn:
            found = await instances.get(conn, server)
        return (found.vm_state, found.task_state) == (VmState.SOFT_DELETED, None) or None

    assert await eventually(soft_deleted)


async def test_a_soft_delete_an_agent_took_is_left_until_its_agent_finishes_it(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Taken and not finished (its agent died at it), a soft delete is not sent again,
    and the task deadline leaves it too: only the agent's result, once its message comes
    back to it, makes the server soft-deleted. Its service deleted, the deadline clears
    it as any other task."""
    server = await deleting_past_its_deadline(
        db_pool, conductor, agent_transport, "oad-soft-took", TaskState.SOFT_DELETING
    )
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instance_actions SET taken_at = now() WHERE instance_uuid = $1", server
        )

    assert await resender(db_pool, agent_transport).sweep() == 0
    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    assert await task_of(db_pool, server) == TaskState.SOFT_DELETING

    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE services s SET deleted_at = now()
                 FROM compute_nodes n, instances i
                WHERE i.uuid = $1 AND n.id = i.compute_id AND s.id = n.service_id""",
            server,
        )
    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 1
    assert await task_of(db_pool, server) is None


async def restoring_past_its_deadline(
    pool: asyncpg.Pool, conductor: ConductorAPI, transport: AmqpTransport, prefix: str
) -> UUID:
    """A server built on a stand-in agent, soft-deleted two hours ago (past any reclaim
    interval of these tests) and then marked ``restoring`` as keel-api marks it, an hour
    ago; its restore never reached the agent."""
    server, _, _ = await placed_on_a(pool, conductor, transport, prefix)
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET vm_state = $2, task_state = $3,
                      soft_deleted_at = now() - interval '2 hours',
                      updated_at = now() - interval '1 hour'
                WHERE uuid = $1""",
            server,
            VmState.SOFT_DELETED.value,
            TaskState.RESTORING.value,
        )
        await instance_actions.start(conn, RequestContext(user_id="u"), server, "restore")
    return server


async def test_a_restore_no_agent_took_is_sent_again_and_never_reclaimed(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """A restore answered 202 never reached the agent (or the agent was down past the
    timeout): the task deadline leaves ``restoring`` (cleared, the soft-delete sweep
    would reclaim the server the user asked back), the sweep sends it once, and the
    agent restores the server."""
    server = await restoring_past_its_deadline(db_pool, conductor, agent_transport, "oad-rst")

    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    async with db_pool.acquire() as conn:
        assert await instances.begin_reclaim(conn, 60.0) == []
    sent = await asyncio.gather(*(resender(db_pool, agent_transport).sweep() for _ in range(2)))
    assert sorted(sent) == [0, 1]

    async def restored() -> bool | None:
        async with db_pool.acquire() as conn:
            found = await instances.get(conn, server)
        return (found.vm_state, found.task_state) == (VmState.ACTIVE, None) or None

    assert await eventually(restored)


async def test_a_restore_an_agent_took_is_left_until_its_agent_finishes_it(
    db_pool: asyncpg.Pool, conductor: ConductorAPI, agent_transport: AmqpTransport
) -> None:
    """Taken and not finished, a restore is neither sent again nor cleared: its agent's
    result ends it."""
    server = await restoring_past_its_deadline(db_pool, conductor, agent_transport, "oad-rtk")
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instance_actions SET taken_at = now() WHERE instance_uuid = $1", server
        )

    assert await resender(db_pool, agent_transport).sweep() == 0
    assert await TaskDeadline(db_pool, TIMEOUT).sweep() == 0
    assert await task_of(db_pool, server) == TaskState.RESTORING


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
@pytest.mark.parametrize("task", [TaskState.SOFT_DELETING, TaskState.RESTORING])
async def test_a_resend_whose_database_call_fails_once_is_kept_by_a_later_sweep(
    db_pool: asyncpg.Pool,
    conductor: ConductorAPI,
    agent_transport: AmqpTransport,
    task: TaskState,
    answered: bool,
) -> None:
    """Each database call of the sweep fails once, before or after the database acted;
    then, its timeout passed again, two sweeps run at once: the soft delete (the
    restore) keel-api promised is carried out all the same, and its server ends as the
    request said."""
    counter = iter(range(1000))
    ends = {
        TaskState.SOFT_DELETING: (VmState.SOFT_DELETED, None),
        TaskState.RESTORING: (VmState.ACTIVE, None),
    }

    async def scenario(at: int) -> FailsOnce:
        prefix = f"oad-f{task[:4]}{int(answered)}{next(counter)}"
        if task == TaskState.RESTORING:
            server = await restoring_past_its_deadline(db_pool, conductor, agent_transport, prefix)
        else:
            server = await deleting_past_its_deadline(
                db_pool, conductor, agent_transport, prefix, task
            )
        flaky = FailsOnce(db_pool, at, answered=answered)
        sweep = PromisedRequests(
            flaky.as_pool(),
            ComputeAPI(agent_transport, timeout=SOON),
            timeout=TIMEOUT,
            down_time=60,
        )
        try:
            await sweep.sweep()
        except asyncpg.ConnectionDoesNotExistError:
            assert flaky.failed
        async with db_pool.acquire() as conn:  # its timeout passes again
            await conn.execute(
                "UPDATE instances SET updated_at = now() - interval '1 hour' WHERE uuid = $1",
                server,
            )
        await asyncio.gather(*(resender(db_pool, agent_transport).sweep() for _ in range(2)))

        async def ended() -> bool | None:
            async with db_pool.acquire() as conn:
                found = await instances.get(conn, server)
            return (found.vm_state, found.task_state) == ends[task] or None

        assert await eventually(ended), flaky.calls
        return flaky

    assert await every_call(scenario) >= 1
