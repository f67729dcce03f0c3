"""Deletes no agent took: sent again until one does, never cleared by the task deadline.

A delete keel-api answered 204 for must happen. keel-api withdraws a delete it could not
confirm sent (503: nothing happened) only while the agent it was for takes requests
before acting (release 17 and later): an agent of an older release acts on whatever
reaches it, so such a delete may have gone out after all and cannot be withdrawn;
keel-api answers 204 and the server stays ``deleting``. If the message never reached the
broker, nothing would delete the server — and once that agent was upgraded, or came
back, the task deadline cleared ``deleting`` and the server lived on.

So a server ``deleting`` past ``KEEL_TASK_TIMEOUT`` whose delete request no agent has
taken (nor keel-api withdrawn, nor anything ended) is this pass's, not the task
deadline's (:class:`services.conductor.deadlines.TaskDeadline` leaves it), while its
host's compute service exists. While that service is up the delete is sent again, under
its own request id, once per timeout, until an agent takes it or the server is gone (a
terminate is idempotent: a second copy of one that did arrive deletes nothing more; an
agent that takes requests marks it taken, which ends the resending). While the service
is down the server waits as it is: the delete may be in its agent's queue, and deleting
the server again deletes it without the agent, as for any server on a host that is down.

A soft delete (``soft-deleting``, recorded as a delete too) is a delete here: keel-api
answered 204 for it, so the server must end soft-deleted; one no agent took is sent
again as a soft delete. One an agent took and has not finished is left too (not sent):
its agent died at it, or is at it, and its message comes back to it when it starts
again; only its result ends the task (a delete's agent deletes the server whatever
became of its task, so a delete taken is left to the task deadline).

Resending a delete no agent took never contradicts an answer: keel-api answered 204
(it must happen), or was cut off before answering (either outcome is allowed).
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from shared.context import RequestContext
from shared.db.instance_actions import UNDER_WAY_SQL
from shared.exceptions import MessagingError
from shared.objects.states import TaskState

LOG = logging.getLogger(__name__)

#: The tasks of a delete: a delete's, and a soft delete's.
DELETE_TASKS = (TaskState.DELETING.value, TaskState.SOFT_DELETING.value)

_ON_AN_EXISTING_SERVICE = """EXISTS (
        SELECT 1 FROM compute_nodes n JOIN services s ON s.id = n.service_id
         WHERE n.id = i.compute_id AND s.deleted_at IS NULL)"""

#: A delete of instance ``i`` (its task one of :data:`DELETE_TASKS`) that no agent took,
#: keel-api did not withdraw and nothing ended, on a host whose compute service exists:
#: this pass's, not the task deadline's.
UNTAKEN_DELETE_SQL = f"""(
    EXISTS (SELECT 1 FROM instance_actions a
             WHERE a.instance_uuid = i.uuid AND a.action = 'delete' AND {UNDER_WAY_SQL})
    AND {_ON_AN_EXISTING_SERVICE})"""

#: Instance ``i``'s delete task that the task deadline leaves however long it lasts: a
#: delete or soft delete no agent took (this pass sends it again), and a soft delete an
#: agent took and has not finished, on a host whose compute service exists. That agent
#: died at it, or is at it: its message comes back to it when it starts again, and only
#: its result makes the server soft-deleted (a delete's needs no task: its agent deletes
#: the server whatever became of it). Cleared, the server answered 204 would run on.
LEFT_BY_THE_TASK_DEADLINE_SQL = f"""(
    (i.task_state IN ('{TaskState.DELETING.value}', '{TaskState.SOFT_DELETING.value}')
     AND {UNTAKEN_DELETE_SQL})
    OR (i.task_state = '{TaskState.SOFT_DELETING.value}'
        AND EXISTS (SELECT 1 FROM instance_actions a
                     WHERE a.instance_uuid = i.uuid AND a.action = 'delete'
                       AND a.withdrawn_at IS NULL AND a.finish_time IS NULL)
        AND {_ON_AN_EXISTING_SERVICE}))"""


class UntakenDeletes:
    """Sends again, once per ``timeout``, the deletes (and soft deletes) of servers still
    ``deleting`` (``soft-deleting``) that no agent took, while their host's compute
    service is up."""

    def __init__(
        self, pool: asyncpg.Pool, compute: ComputeAPI, *, timeout: float, down_time: float
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.timeout = timeout
        self.down_time = down_time

    async def sweep(self) -> int:
        """One pass; how many deletes it sent again."""
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
                                WHERE a.instance_uuid = i.uuid AND a.action = 'delete'
                                  AND {UNDER_WAY_SQL}
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
                list(DELETE_TASKS),
            )
        for row in rows:
            ctx = RequestContext(
                **({"request_id": row["request_id"]} if row["request_id"] else {}),
                user_id=row["user_id"],
                project_id=row["project_id"],
            )
            soft = row["task_state"] == TaskState.SOFT_DELETING.value
            await self._send(ctx, row["uuid"], row["service"], row["host"], soft=soft)
        return len(rows)

    async def _send(
        self, ctx: RequestContext, server: UUID, service: UUID, host: str, *, soft: bool
    ) -> None:
        extra = {"instance_uuid": str(server), "decision": "delete_sent_again"}
        send = self.compute.soft_delete_instance if soft else self.compute.terminate_instance
        try:
            await send(ctx, service, server)
        except MessagingError as exc:
            LOG.warning(
                "server %s is still being %sdeleted %gs after its delete, which no agent took; "
                "sending it again to compute service %s on %s failed (%s): the next pass "
                "tries again",
                server,
                "soft-" if soft else "",
                self.timeout,
                service,
                host,
                exc.message,
                extra=extra,
            )
            return
        LOG.warning(
            "server %s is still being %sdeleted %gs after its delete (request %s), which no "
            "agent took: it may never have reached the agent on %s, so it was sent again",
            server,
            "soft-" if soft else "",
            self.timeout,
            ctx.request_id,
            host,
            extra=extra,
        )
