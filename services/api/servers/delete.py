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

If the broker itself cannot be reached the delete fails with 503 and nothing changes.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

import asyncpg

from services.api.http.faults import ServiceUnavailable
from services.api.servers.lookup import host_service
from services.compute.rpcapi import ComputeAPI
from shared.context import RequestContext
from shared.db import allocations, fixed_ips, instance_actions, instances
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.exceptions import InstanceNotFound, MessagingError, Unroutable
from shared.objects.instance import Allocation, Instance
from shared.objects.service import Service
from shared.objects.states import TaskState

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
        reason = "never scheduled to a host"
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
    await _terminate_on_host(pool, compute, ctx, instance, service)


async def _terminate_on_host(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    instance: Instance,
    service: Service,
) -> None:
    extra: dict[str, Any] = {"instance_uuid": str(instance.uuid)}

    async def mark_deleting(conn: Connection) -> None:
        await instances.set_task_state(conn, instance.uuid, TaskState.DELETING)
        await instance_actions.start(conn, ctx, instance.uuid, DELETE_ACTION)

    await in_transaction(pool, mark_deleting, what=f"marking server {instance.uuid} deleting")
    try:
        await compute.terminate_instance(ctx, service.uuid, instance.uuid)
    except Unroutable:
        why = f"no queue for its compute service {service.uuid}"
        _warn_files_remain(instance, why)
        await local_delete(pool, ctx, instance.uuid, why, started=True)
        return
    except MessagingError as exc:
        await _restore(pool, instance, exc.message)
        raise ServiceUnavailable(
            f"The server was not deleted: the message bus could not be reached ({exc.message}). "
            "Retry once RabbitMQ is available."
        ) from None
    LOG.info(
        "asked compute service %s on %s to delete server %s",
        service.uuid,
        service.host,
        instance.uuid,
        extra=extra,
    )


async def _restore(pool: asyncpg.Pool, instance: Instance, reason: str) -> None:
    """Undo the ``deleting`` mark after the delete request could not be sent."""

    async def restore(conn: Connection) -> None:
        await instances.swap_task_state(
            conn, instance.uuid, expected=TaskState.DELETING, new=instance_task(instance)
        )
        await instance_actions.finish(conn, instance.uuid, DELETE_ACTION, reason)

    await in_transaction(pool, restore, what=f"restoring server {instance.uuid}")


def instance_task(instance: Instance) -> TaskState | None:
    """The task state to restore after a failed delete request."""
    if instance.task_state in (None, TaskState.DELETING):
        return None
    try:
        return TaskState(instance.task_state)
    except ValueError:
        return None
