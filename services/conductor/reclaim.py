"""The reclaim of soft-deleted servers: Nova's ``_reclaim_queued_deletes``, in the
conductors' deadline sweep.

With ``KEEL_RECLAIM_INSTANCE_INTERVAL`` above 0, a DELETE leaves a server SOFT_DELETED
(:mod:`services.api.servers.soft_delete`). Each pass deletes for good those soft-deleted
longer than the interval, as a delete does: the server is marked ``deleting`` (with a
``delete`` action by ``keel-reclaim``) and ``terminate_instance`` cast to its host's
agent, which destroys the guest and reports it deleted (the conductor then releases the
claims and addresses); with that agent down, gone or without a queue, the server is
deleted here at once, its guest's files left on the host until its agent runs again.

Safe when several conductors sweep at once: a server is taken by one compare-and-swap
(rows another sweep holds are skipped), so only one of them sends its delete. A delete
that cannot be sent is handed back (task cleared) for the next pass; one that went out
after all is done twice, harmlessly (a terminate of a guest that is gone reports it
deleted again).
"""

from __future__ import annotations

import logging

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor import instance_events
from shared.context import RequestContext
from shared.db import instance_actions, instances, placement
from shared.exceptions import MessagingError, Unroutable
from shared.objects.instance import Instance
from shared.objects.states import TaskState

LOG = logging.getLogger(__name__)

#: Who the reclaim's ``delete`` actions are recorded as.
RECLAIM_USER = "keel-reclaim"
DELETE_ACTION = "delete"


class SoftDeleteReclaim:
    """Deletes servers soft-deleted longer than ``interval`` seconds (0: never)."""

    def __init__(
        self, pool: asyncpg.Pool, compute: ComputeAPI, *, interval: float, down_time: float
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.interval = interval
        self.down_time = down_time

    async def sweep(self) -> int:
        """One pass; how many servers it deleted or asked their agents to delete."""
        if self.interval <= 0:
            return 0
        async with self.pool.acquire() as conn, conn.transaction():
            taken = await instances.begin_reclaim(conn, self.interval)
            contexts = {}
            for instance in taken:
                ctx = RequestContext(
                    user_id=RECLAIM_USER, project_id=instance.project_id, roles=("admin",)
                )
                await instance_actions.start(conn, ctx, instance.uuid, DELETE_ACTION)
                contexts[instance.uuid] = ctx
        for instance in taken:
            await self._delete(contexts[instance.uuid], instance)
        return len(taken)

    async def _delete(self, ctx: RequestContext, instance: Instance) -> None:
        extra = {"instance_uuid": str(instance.uuid), "decision": "soft_delete_reclaimed"}
        async with self.pool.acquire() as conn:
            host = await placement.host_of(conn, instance, self.down_time)
        if host is None or not host.service.is_up:
            await self._delete_here(instance, "gone" if host is None else "down")
            return
        try:
            await self.compute.terminate_instance(ctx, host.service.uuid, instance.uuid)
        except Unroutable:
            await self._delete_here(instance, "without a queue on the message bus")
            return
        except MessagingError as exc:
            await self._hand_back(ctx, instance, exc.message)
            return
        LOG.info(
            "server %s was soft-deleted more than %gs ago: asked compute service %s on %s "
            "to delete it",
            instance.uuid,
            self.interval,
            host.service.uuid,
            host.service.host,
            extra=extra,
        )

    async def _delete_here(self, instance: Instance, why: str) -> None:
        LOG.warning(
            "server %s was soft-deleted more than %gs ago; its compute service on %s is %s, "
            "so it is deleted without its agent: the guest's files remain on that host until "
            "its agent runs again",
            instance.uuid,
            self.interval,
            instance.host,
            why,
            extra={"instance_uuid": str(instance.uuid), "decision": "local_delete"},
        )
        await instance_events.record_deleted(self.pool, instance.uuid)

    async def _hand_back(self, ctx: RequestContext, instance: Instance, why: str) -> None:
        """The delete could not be confirmed as sent: withdraw it and clear its task so
        the next pass tries again — unless its agent already took it (the cast went out
        after all): then the delete goes on, as a withdrawal would be a lie (the agent
        destroys the guest of a server the database would show as soft-deleted, which a
        restore could then bring back without its disk)."""
        message = f"not sent ({why}); tried again later"
        async with self.pool.acquire() as conn, conn.transaction():

            async def undo() -> bool:
                back = await instances.swap_task_state(
                    conn, instance.uuid, expected=TaskState.DELETING, new=None
                )
                return back is not None

            withdrawn = await instance_actions.withdraw_untaken(
                conn, instance.uuid, ctx.request_id, message, undo
            )
        extra = {"instance_uuid": str(instance.uuid)}
        if not withdrawn:
            LOG.info(
                "the reclaim of soft-deleted server %s was not confirmed as sent (%s), but "
                "its agent took it (or acts without taking requests): the delete goes on",
                instance.uuid,
                why,
                extra={**extra, "decision": "soft_delete_reclaimed"},
            )
            return
        LOG.warning(
            "the reclaim of soft-deleted server %s could not be sent (%s); the next pass "
            "tries again",
            instance.uuid,
            why,
            extra=extra,
        )
