"""Deleting a server: by its compute agent when that agent is up, locally otherwise.

* Never placed on a host (still scheduling, or no valid host was found): a *local
  delete*: its claims are released and the row soft-deleted in one transaction — but
  only while no host is recorded for it. If the conductor placed it in the meantime,
  the delete goes to that host's agent instead, since a guest may be on its way there.
* On a host whose compute service is up: task state ``deleting`` and
  ``terminate_instance`` cast to ``compute.<service-uuid>``, the service found by id
  (instance → compute node → service; see :mod:`shared.db.placement`). The agent destroys the guest
  and tells the conductor, which releases the claims and soft-deletes the row.
* On a host whose service is down, gone, or has no queue on the broker: a local delete,
  with a WARNING naming the host, because the guest's files remain there until the
  agent comes back and cleans up.

If the broker itself cannot be reached, the delete is sent again a few times; then its
``deleting`` mark is withdrawn (unless the agent already took it) and the answer is 503
(see :mod:`services.api.servers.publish`).

**Delete wins over a move.** Once the delete is sent, the server's moves under way end
``cancelled`` (a cold migration awaiting confirmation ends ``confirmed``) and the other
end of each is asked to remove its copy; a late step of a cancelled move finds the server
deleted and removes what it built; an agent that was down removes its copy at its next
guest report. Both hosts' claims go with the server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg

from services.api.http.faults import ServiceUnavailable
from services.api.servers import publish
from services.api.servers.lookup import host_service
from services.compute.rpcapi import ComputeAPI
from shared.context import RequestContext
from shared.db import (
    allocations,
    compute_nodes,
    fixed_ips,
    instance_actions,
    instances,
    moves,
    shelves,
)
from shared.db.errors import describe, is_transient
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.exceptions import (
    ComputeNodeNotFound,
    InstanceNotFound,
    KeelError,
    Unroutable,
)
from shared.objects.instance import Allocation, Instance
from shared.objects.migration import Migration
from shared.objects.service import Service
from shared.objects.states import TaskState, VmState

LOG = logging.getLogger(__name__)

DELETE_ACTION = "delete"


async def local_delete(
    pool: asyncpg.Pool,
    ctx: RequestContext,
    instance_uuid: UUID,
    reason: str,
    *,
    started: bool,
    unplaced_only: bool = False,
) -> bool:
    """Release the claims and addresses and soft-delete, in one transaction (idempotent).

    With ``unplaced_only``, nothing happens (False) if a host was recorded meanwhile.
    """

    async def delete(conn: Connection) -> list[Allocation] | None:
        if unplaced_only:
            if not await instances.soft_delete_unplaced(conn, instance_uuid):
                return None
        else:
            await instances.soft_delete(conn, instance_uuid)
        if not started:
            await instance_actions.start(conn, ctx, instance_uuid, DELETE_ACTION)
        released = await allocations.release_instance(conn, instance_uuid)
        await fixed_ips.release(conn, instance_uuid)
        await shelves.delete_image_of_deleted(conn, instance_uuid)
        await instance_actions.finish(conn, instance_uuid, DELETE_ACTION, reason, error=False)
        return released

    released = await in_transaction(pool, delete, what=f"deleting server {instance_uuid}")
    if released is None:
        return False
    LOG.info(
        "deleted server %s locally (%s); released %d claim(s)",
        instance_uuid,
        reason,
        len(released),
        extra={"instance_uuid": str(instance_uuid), "decision": "local_delete"},
    )
    return True


def _warn_files_remain(instance: Instance, why: str) -> None:
    LOG.warning(
        "deleting server %s without its compute agent (%s): the guest's files remain on "
        "host %s until its agent runs again",
        instance.uuid,
        why,
        instance.host,
        extra={"instance_uuid": str(instance.uuid), "decision": "local_delete"},
    )


async def delete_server(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    instance: Instance,
    down_time: float,
) -> None:
    """Delete ``instance``; see the module docstring for who does the work."""
    if not instance.host:
        reason = (
            "shelved and offloaded: no host holds it"
            if instance.vm_state == VmState.SHELVED_OFFLOADED
            else "never scheduled to a host"
        )
        if await local_delete(pool, ctx, instance.uuid, reason, started=False, unplaced_only=True):
            return
        async with pool.acquire() as conn:
            try:
                instance = await instances.get(conn, instance.uuid)
            except InstanceNotFound:
                return
        if not instance.host:
            return
    service = await host_service(pool, instance, down_time)
    if service is None or not service.is_up:
        why = "its compute service is gone" if service is None else "its compute service is down"
        _warn_files_remain(instance, why)
        await local_delete(pool, ctx, instance.uuid, why, started=False)
        return
    await _terminate_on_host(pool, compute, ctx, instance, service, down_time=down_time)


async def _terminate_on_host(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    instance: Instance,
    service: Service,
    *,
    down_time: float,
) -> None:
    extra: dict[str, Any] = {"instance_uuid": str(instance.uuid)}

    async def mark_deleting(conn: Connection) -> Instance | None:
        before = await instances.mark_deleting(conn, instance.uuid)
        await instance_actions.start(conn, ctx, instance.uuid, DELETE_ACTION)
        return before

    # What a withdrawal gives back is what this mark replaced, not what was read before
    # it: the server's task may have moved on meanwhile (a move going on, say).
    # A mark whose commit lost its answer is withdrawn before the 503: left standing,
    # the conductors would send the delete later, after a 503.
    reason = "the connection to the database was lost as the delete was recorded"
    marked = await publish.record(
        pool,
        mark_deleting,
        what=f"marking server {instance.uuid} deleting",
        withdraw=_restoring(ctx, instance, reason),
        instance_uuid=instance.uuid,
        request_id=ctx.request_id,
    )
    instance = marked or instance
    try:
        failed = await publish.send(
            lambda: compute.terminate_instance(ctx, service.uuid, instance.uuid),
            what=f"the delete of server {instance.uuid}",
        )
    except Unroutable:
        why = f"no queue for its compute service {service.uuid}"
        _warn_files_remain(instance, why)
        await local_delete(pool, ctx, instance.uuid, why, started=True)
        return
    if failed is not None:
        if await _restore(pool, ctx, instance, failed.message):
            raise ServiceUnavailable(
                f"The server was not deleted: the message bus could not be reached "
                f"({failed.message}). Retry once RabbitMQ is available."
            )
        LOG.warning(
            "the delete of server %s could not be confirmed sent (%s), but its agent already "
            "took it",
            instance.uuid,
            failed.message,
            extra=extra,
        )

    async def cancel_moves(conn: Connection) -> list[Migration]:
        await conn.execute("SELECT 1 FROM instances WHERE uuid = $1 FOR UPDATE", instance.uuid)
        return await moves.cancel_for_delete(conn, instance.uuid)

    # Delete wins over any move: sent, it ends the server's moves under way now, so no
    # step of theirs goes on; each move's other end is asked to remove its copy.
    try:
        cancelled = await in_transaction(
            pool, cancel_moves, what=f"cancelling the moves of server {instance.uuid}"
        )
    except Exception as exc:
        if not is_transient(exc):
            raise
        # The delete is on its way (or stands, for the conductors to send again): it
        # happens, so the answer is 204 all the same. A move of the server left under way
        # finds it gone at its next step, or ends by its deadline.
        LOG.warning(
            "the delete of server %s is sent, but its moves could not be ended: the database "
            "is unavailable (%s); each ends at its next step or by its deadline",
            instance.uuid,
            describe(exc),
            extra=extra,
        )
        cancelled = []
    LOG.info(
        "asked compute service %s on %s to delete server %s",
        service.uuid,
        service.host,
        instance.uuid,
        extra=extra,
    )
    for migration in cancelled:
        await _remove_other_copy(
            pool, compute, ctx, migration, current=service, down_time=down_time
        )


async def _remove_other_copy(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    migration: Migration,
    *,
    current: Service,
    down_time: float,
) -> None:
    """Delete wins over a move: ask the move's other end to remove the copy it holds.

    Best effort: an agent that is down (or a copy still being built) is handled by that
    agent's next guest report, or by the move's late result, since the server is gone.
    """
    for node_id in (migration.source_compute_id, migration.dest_compute_id):
        if node_id is None:
            continue
        try:
            async with pool.acquire() as conn:
                host = await compute_nodes.host_state_by_id(conn, node_id, down_time)
        except ComputeNodeNotFound:
            continue
        except Exception as exc:
            if not is_transient(exc):
                raise
            # The delete is sent: it happens, and the answer says so. The copy is left to
            # that host's next guest report, which finds the server gone.
            LOG.warning(
                "server %s is being deleted during %s %s; the database is unavailable (%s), "
                "so its other copy is left to that host's next guest report",
                migration.instance_uuid,
                migration.migration_type,
                migration.uuid,
                describe(exc),
                extra={"instance_uuid": str(migration.instance_uuid)},
            )
            return
        if host.service.id == current.id or not host.service.is_up:
            continue
        only_origin = migration.uuid if node_id == migration.dest_compute_id else None
        try:
            await compute.remove_moved_guest(
                ctx,
                host.service.uuid,
                migration.instance_uuid,
                migration.uuid,
                only_origin=only_origin,
            )
        except KeelError as exc:
            LOG.warning(
                "server %s is being deleted during %s %s; its copy on %s is left to that "
                "host's next guest report (%s)",
                migration.instance_uuid,
                migration.migration_type,
                migration.uuid,
                host.node.host,
                exc.message,
                extra={"instance_uuid": str(migration.instance_uuid)},
            )


async def _restore(
    pool: asyncpg.Pool, ctx: RequestContext, instance: Instance, reason: str
) -> bool:
    """Undo the ``deleting`` mark after the delete could not be sent, and withdraw the
    request; False if its agent already took it (or, an agent of an older release,
    deleted the server, or its task moved on).

    A server another delete marked ``deleting`` keeps its task: one that came earlier,
    or one at the same time that began from the same state as this one (each wrote the
    mark; only the last to withdraw may take it back). That delete's message may be on
    its way (it was answered 204), or its deadline clears the task; withdrawn, this one
    leaves the server as that delete left it.

    The task it found is given back only while the request that began it is still open
    (neither ended nor withdrawn): a move or a soft delete that could not be sent while
    this mark stood has gone, and so has its task."""
    return await publish.withdraw(
        pool, _restoring(ctx, instance, reason), what=f"withdrawing the delete of {instance.uuid}"
    )


def _restoring(
    ctx: RequestContext, instance: Instance, reason: str
) -> Callable[[Connection], Awaitable[bool]]:
    """The transaction's work of :func:`_restore`."""

    async def restore(conn: Connection) -> bool:
        async def undo() -> bool:
            # A soft delete records itself as a delete too, but its mark is its own
            # task: a withdrawn delete that found it puts it back.
            found_soft = instance.task_state == TaskState.SOFT_DELETING
            if instance.task_state == TaskState.DELETING or (
                not found_soft
                and await instance_actions.another_under_way(
                    conn, instance.uuid, DELETE_ACTION, ctx.request_id
                )
            ):
                still = await conn.fetchval(
                    "SELECT task_state FROM instances WHERE uuid = $1 AND deleted_at IS NULL",
                    instance.uuid,
                )
                return bool(still == TaskState.DELETING.value)
            task = instance_task(instance)
            if task is not None and not await instance_actions.lock_others_open(
                conn, instance.uuid, ctx.request_id
            ):
                # The request that began the task was withdrawn or ended while this
                # delete's mark stood over it: giving the task back would leave it to
                # nobody.
                task = None
            restored = await instances.undo_deleting(conn, instance.uuid, found=instance, task=task)
            return restored is not None

        return await instance_actions.withdraw_untaken(
            conn, instance.uuid, ctx.request_id, reason, undo
        )

    return restore


def instance_task(instance: Instance) -> TaskState | None:
    """The task state to restore after a failed delete request."""
    if instance.task_state is None:
        return None
    try:
        return TaskState(instance.task_state)
    except ValueError:
        return None
