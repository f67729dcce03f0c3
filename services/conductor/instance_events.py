"""What agents report about instances: a build finished or failed, a guest was deleted.

Both arrive as casts, delivered at least once, so each handler is idempotent: a result
for an instance that is no longer building is a repeat and changes nothing; releasing a
claim or soft-deleting twice is harmless.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.conductor.rpcapi import InstanceBuildResult
from services.conductor.tasks.build import CREATE_ACTION
from shared.db import allocations, fixed_ips, instance_actions, instances
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.states import VmState

LOG = logging.getLogger(__name__)

DELETE_ACTION = "delete"


async def _release_for_deleted(conn: Connection, instance_uuid: UUID) -> None:
    released = await allocations.release(conn, instance_uuid)
    await instance_actions.finish(conn, instance_uuid, CREATE_ACTION, "Instance was deleted.")
    LOG.info(
        "instance %s was deleted during its build; released %d claim(s)",
        instance_uuid,
        len(released),
        extra={"instance_uuid": str(instance_uuid), "decision": "claim_released"},
    )


async def record_build_result(pool: asyncpg.Pool, req: InstanceBuildResult) -> None:
    """ACTIVE on success; on failure ERROR with the agent's message and the claim released."""
    extra = {"instance_uuid": str(req.instance_uuid)}
    async with pool.acquire() as conn, conn.transaction():
        try:
            instance = await instances.get(conn, req.instance_uuid)
        except InstanceNotFound:
            await _release_for_deleted(conn, req.instance_uuid)
            return
        if instance.vm_state != VmState.BUILDING:
            LOG.info(
                "ignoring build result for instance %s: it is %s, its build was already recorded",
                req.instance_uuid,
                instance.vm_state,
                extra=extra,
            )
            return
        if req.success:
            if await instances.set_active(conn, req.instance_uuid) is None:
                await _release_for_deleted(conn, req.instance_uuid)
                return
            await instance_actions.finish(conn, req.instance_uuid, CREATE_ACTION)
            LOG.info(
                "instance %s is ACTIVE on host %s",
                req.instance_uuid,
                instance.host,
                extra={**extra, "decision": "build_succeeded"},
            )
            return
        message = req.message or f"Build of instance {req.instance_uuid} failed on {instance.host}."
        await instances.set_error(conn, req.instance_uuid, message=message, code=500)
        released = await allocations.release(conn, req.instance_uuid)
        await instance_actions.finish(conn, req.instance_uuid, CREATE_ACTION, message)
    LOG.info(
        "build of instance %s failed on host %s: %s; released %d claim(s)",
        req.instance_uuid,
        instance.host,
        message,
        len(released),
        extra={**extra, "decision": "build_failed"},
    )


async def record_deleted(pool: asyncpg.Pool, instance_uuid: UUID) -> None:
    """Release the instance's claims and addresses, soft-delete it, close its delete action."""
    async with pool.acquire() as conn, conn.transaction():
        released = await allocations.release(conn, instance_uuid)
        deleted = await instances.soft_delete(conn, instance_uuid)
        await fixed_ips.release(conn, instance_uuid)
        await instance_actions.finish(conn, instance_uuid, DELETE_ACTION)
    if deleted or released:
        LOG.info(
            "instance %s deleted; released %d claim(s)",
            instance_uuid,
            len(released),
            extra={"instance_uuid": str(instance_uuid), "decision": "instance_deleted"},
        )
    else:
        LOG.debug("instance %s was already deleted", instance_uuid)
