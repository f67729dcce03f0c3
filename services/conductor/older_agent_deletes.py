"""Deletes keel-api answered for but could not confirm sent to an agent of an older release.

keel-api withdraws a delete it could not send (503: nothing happened) only while the
agent it was for takes requests before acting (release 17 and later). An agent of an
older release acts on whatever reaches it, so such a delete may have gone out after all
and cannot be withdrawn: keel-api answers as for a delete sent (204), and the server
stays ``deleting``. If the message never reached the broker, nothing would ever delete
it, and the task deadline would clear the task: a delete answered 204 that never happens.

This pass keeps that promise. A server still ``deleting`` past ``KEEL_TASK_TIMEOUT`` on a
host whose agent is of such a release is not cleared by the task deadline
(:class:`services.conductor.deadlines.TaskDeadline` leaves it here); while that agent is
up its delete is sent again, once per timeout, until the agent has deleted the server (a
terminate is idempotent: a second copy of one that did arrive deletes nothing more).
While the agent is down the server waits as it is: the delete may be in its queue, and
deleting the server again deletes it without the agent, as for any server on a host
that is down.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from shared.context import RequestContext
from shared.exceptions import MessagingError
from shared.versions import TAKING_REQUESTS_VERSION

LOG = logging.getLogger(__name__)

#: Who the deletes sent again are from, in the agents' logs.
RESEND_USER = "keel-conductor"

#: The hosts whose agents act without taking requests: a ``deleting`` server there is
#: this pass's, not the task deadline's. ``i`` is the instance.
ON_AN_OLDER_AGENT_SQL = f"""EXISTS (
    SELECT 1 FROM compute_nodes n JOIN services s ON s.id = n.service_id
     WHERE n.id = i.compute_id AND s.deleted_at IS NULL
       AND s.version < {TAKING_REQUESTS_VERSION})"""


class OlderAgentDeletes:
    """Sends again, once per ``timeout``, the deletes of servers still ``deleting`` on a
    host whose agent (up, of a release that acts without taking requests) never did it."""

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
                f"""UPDATE instances i SET updated_at = now()
                      FROM compute_nodes n JOIN services s ON s.id = n.service_id
                     WHERE i.task_state = 'deleting' AND i.deleted_at IS NULL
                       AND i.updated_at < now() - make_interval(secs => $1)
                       AND n.id = i.compute_id AND s.deleted_at IS NULL
                       AND s.version < {TAKING_REQUESTS_VERSION}
                       AND NOT s.forced_down AND s.last_seen_up IS NOT NULL
                       AND s.last_seen_up > now() - make_interval(secs => $2)
                 RETURNING i.uuid, i.project_id, s.uuid AS service, s.host""",
                self.timeout,
                self.down_time,
            )
        for row in rows:
            await self._send(row["uuid"], row["project_id"], row["service"], row["host"])
        return len(rows)

    async def _send(self, server: UUID, project_id: str, service: UUID, host: str) -> None:
        extra = {"instance_uuid": str(server), "decision": "delete_sent_again"}
        ctx = RequestContext(user_id=RESEND_USER, project_id=project_id, roles=("admin",))
        try:
            await self.compute.terminate_instance(ctx, service, server)
        except MessagingError as exc:
            LOG.warning(
                "server %s is still being deleted %gs after its delete; sending the delete "
                "again to compute service %s on %s failed (%s): the next pass tries again",
                server,
                self.timeout,
                service,
                host,
                exc.message,
                extra=extra,
            )
            return
        LOG.warning(
            "server %s is still being deleted %gs after its delete, and the agent on %s acts "
            "without taking requests (an older release): the delete keel-api could not "
            "confirm sent may never have reached it, so it was sent again",
            server,
            self.timeout,
            host,
            extra=extra,
        )
