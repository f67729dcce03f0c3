"""Requests keel-api promised: deletes, soft deletes and restores that the task deadline
never clears while their host's compute service exists, sent again while no agent took
them.

A DELETE answered 204 must happen, and so must a restore answered 202: the server must
end deleted (or soft-deleted), or running again. Clearing the task of one would break
that answer: a server answered 204 would run on, and a soft-deleted server whose restore
was answered 202 would be reclaimed by the soft-delete sweep, its data with it.

**Not taken.** keel-api withdraws a request it could not confirm sent (503: nothing
happened) only while the agent it was for takes requests before acting (release 17 and
later): an agent of an older release acts on whatever reaches it, so such a request may
have gone out after all and cannot be withdrawn; keel-api answers as if it was sent. If
the message never reached the broker, nothing would carry it out; if it did and its
agent was down past ``KEEL_TASK_TIMEOUT``, the agent, back, would find its request ended
by the task deadline and do nothing. So a server in one of these tasks past the timeout
whose request no agent has taken (nor keel-api withdrawn, nor anything ended) is this
pass's, not the task deadline's (:class:`services.conductor.deadlines.TaskDeadline`
leaves it), while its host's compute service exists. While that service is up the
request is sent again, under its own request id, once per timeout, until an agent takes
it or the server is gone (each is idempotent: a terminate deletes nothing more, a power
off or on of a guest already off or on changes nothing, and an agent that takes requests
marks it taken, which ends the resending). While the service is down the server waits
as it is: the request may be in its agent's queue (deleting the server again deletes it
without the agent, as for any server on a host that is down).

**Taken, not finished.** A soft delete or a restore an agent took and has not finished
is left too (not sent): its agent died at it, or is at it, and its message comes back to
it when it starts again; only its result ends the task. (A delete's agent deletes the
server whatever became of its task, so a delete taken is left to the task deadline.)

Once the host's compute service is deleted, the task deadline clears such a task as any
other: a soft delete leaves the server as it was, a restore leaves it soft-deleted.

Resending a request no agent took never contradicts an answer: keel-api answered that
it would happen, or was cut off before answering (either outcome is allowed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from shared.context import RequestContext
from shared.db.instance_actions import UNDER_WAY_SQL
from shared.exceptions import MessagingError
from shared.objects.states import TaskState

LOG = logging.getLogger(__name__)

#: The promised tasks and the instance action each is recorded as (a soft delete is a
#: DELETE's, recorded as a delete).
ACTIONS = {
    TaskState.DELETING.value: "delete",
    TaskState.SOFT_DELETING.value: "delete",
    TaskState.RESTORING.value: "restore",
}
#: Of those, the tasks only their agent's result ends.
ENDED_BY_THEIR_RESULT = (TaskState.SOFT_DELETING.value, TaskState.RESTORING.value)

_ACTION_OF_TASK = (
    "CASE i.task_state "
    + " ".join(f"WHEN '{task}' THEN '{action}'" for task, action in ACTIONS.items())
    + " END"
)
_ON_AN_EXISTING_SERVICE = """EXISTS (
        SELECT 1 FROM compute_nodes n JOIN services s ON s.id = n.service_id
         WHERE n.id = i.compute_id AND s.deleted_at IS NULL)"""


def _tasks(tasks: tuple[str, ...]) -> str:
    return ", ".join(f"'{task}'" for task in tasks)


#: Instance ``i``'s promised task whose request no agent took, keel-api did not withdraw
#: and nothing ended, on a host whose compute service exists: this pass's.
UNTAKEN_SQL = f"""(
    i.task_state IN ({_tasks(tuple(ACTIONS))})
    AND EXISTS (SELECT 1 FROM instance_actions a
                 WHERE a.instance_uuid = i.uuid AND a.action = {_ACTION_OF_TASK}
                   AND {UNDER_WAY_SQL})
    AND {_ON_AN_EXISTING_SERVICE})"""

#: Instance ``i``'s task that the task deadline leaves however long it lasts: a promised
#: request no agent took, and a soft delete or restore an agent took and has not
#: finished, on a host whose compute service exists.
LEFT_BY_THE_TASK_DEADLINE_SQL = f"""(
    {UNTAKEN_SQL}
    OR (i.task_state IN ({_tasks(ENDED_BY_THEIR_RESULT)})
        AND EXISTS (SELECT 1 FROM instance_actions a
                     WHERE a.instance_uuid = i.uuid AND a.action = {_ACTION_OF_TASK}
                       AND a.withdrawn_at IS NULL AND a.finish_time IS NULL)
        AND {_ON_AN_EXISTING_SERVICE}))"""

Send = Callable[[RequestContext, UUID, UUID], Awaitable[None]]


class PromisedRequests:
    """Sends again, once per ``timeout``, the deletes, soft deletes and restores that no
    agent took, while their host's compute service is up."""

    def __init__(
        self, pool: asyncpg.Pool, compute: ComputeAPI, *, timeout: float, down_time: float
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.timeout = timeout
        self.down_time = down_time
        self._senders: dict[str, Send] = {
            TaskState.DELETING.value: compute.terminate_instance,
            TaskState.SOFT_DELETING.value: compute.soft_delete_instance,
            TaskState.RESTORING.value: compute.restore_instance,
        }

    async def sweep(self) -> int:
        """One pass; how many requests it sent again."""
        if self.timeout <= 0:
            return 0
        # Marking each server touched is the claim: of two conductors at once, the second
        # finds the row fresh once the first's update commits, and skips it.
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                f"""WITH due AS (
                       SELECT i.id, i.task_state, s.uuid AS service, s.host, a.request_id,
                              a.user_id
                         FROM instances i
                         JOIN compute_nodes n ON n.id = i.compute_id
                         JOIN services s ON s.id = n.service_id
                         CROSS JOIN LATERAL (
                               SELECT a.request_id, a.user_id FROM instance_actions a
                                WHERE a.instance_uuid = i.uuid
                                  AND a.action = {_ACTION_OF_TASK} AND {UNDER_WAY_SQL}
                                ORDER BY a.id DESC LIMIT 1) a
                        WHERE i.task_state = ANY($3::text[]) AND i.deleted_at IS NULL
                          AND i.updated_at < now() - make_interval(secs => $1)
                          AND s.deleted_at IS NULL AND NOT s.forced_down
                          AND s.last_seen_up IS NOT NULL
                          AND s.last_seen_up > now() - make_interval(secs => $2)
                        ORDER BY i.id LIMIT 100
                          FOR UPDATE OF i SKIP LOCKED)
                   UPDATE instances i SET updated_at = now()
                     FROM due
                    WHERE i.id = due.id
                      AND i.updated_at < now() - make_interval(secs => $1)
                RETURNING i.uuid, i.project_id, due.task_state, due.service, due.host,
                          due.request_id, due.user_id""",
                self.timeout,
                self.down_time,
                list(ACTIONS),
            )
        for row in rows:
            ctx = RequestContext(
                **({"request_id": row["request_id"]} if row["request_id"] else {}),
                user_id=row["user_id"],
                project_id=row["project_id"],
            )
            await self._send(ctx, row["uuid"], row["task_state"], row["service"], row["host"])
        return len(rows)

    async def _send(
        self, ctx: RequestContext, server: UUID, task: str, service: UUID, host: str
    ) -> None:
        extra = {"instance_uuid": str(server), "decision": "request_sent_again"}
        action = ACTIONS[task]
        try:
            await self._senders[task](ctx, service, server)
        except MessagingError as exc:
            LOG.warning(
                "server %s is still %s %gs after its %s, which no agent took; sending it "
                "again to compute service %s on %s failed (%s): the next pass tries again",
                server,
                task,
                self.timeout,
                action,
                service,
                host,
                exc.message,
                extra=extra,
            )
            return
        LOG.warning(
            "server %s is still %s %gs after its %s (request %s), which no agent took: it "
            "may never have reached the agent on %s, so it was sent again",
            server,
            task,
            self.timeout,
            action,
            ctx.request_id,
            host,
            extra=extra,
        )
