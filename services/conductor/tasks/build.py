"""The build workflow: schedule a new instance and hand it to the chosen compute agent.

``build_instances`` is a cast, delivered at least once, so every step is safe to repeat:
an instance that is no longer ``building``/``scheduling`` was already handled and is
left alone, and claims a crashed earlier attempt left behind are released before
scheduling again. Whatever goes wrong after the scheduler claimed a host, the claim is
released and the instance ends in ERROR with a fault that says why.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.conductor.tasks import TaskBase
from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared.context import RequestContext
from shared.db import allocations, fixed_ips, instance_actions, instances, request_specs
from shared.exceptions import InstanceNotFound, KeelError, MessagingError, NoValidHost
from shared.objects.instance import Instance
from shared.objects.states import TaskState, VmState

LOG = logging.getLogger(__name__)

CREATE_ACTION = "create"


class BuildInstanceTask(TaskBase):
    name = "build"

    def __init__(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        *,
        pool: asyncpg.Pool,
        scheduler: SchedulerAPI,
        compute: ComputeAPI,
    ) -> None:
        self.ctx = ctx
        self.instance_uuid = instance_uuid
        self.pool = pool
        self.scheduler = scheduler
        self.compute = compute
        #: Set once the scheduler has claimed a host: from then on a rollback releases it.
        self.selection: Selection | None = None
        self._log_extra = {"instance_uuid": str(instance_uuid)}

    async def execute(self) -> None:
        instance = await self._instance_to_build()
        if instance is None:
            return
        async with self.pool.acquire() as conn:
            spec = await request_specs.get(conn, self.instance_uuid)
            addresses = await fixed_ips.for_instance(conn, self.instance_uuid)
            stale = await allocations.release(conn, self.instance_uuid)
        if stale:
            LOG.info(
                "released %d claim(s) left by an earlier attempt to build instance %s",
                len(stale),
                self.instance_uuid,
                extra={**self._log_extra, "decision": "claim_released"},
            )
        self.selection = await self.scheduler.select_destinations(self.ctx, spec)
        if not await self._record_placement(self.selection):
            return
        await self.compute.build_and_run_instance(
            self.ctx,
            self.selection.service_uuid,
            InstanceSpec(
                uuid=instance.uuid,
                display_name=instance.display_name,
                flavor=instance.flavor,
                image_ref=instance.image_ref,
                node=self.selection.nodename,
                addresses=addresses,
                metadata=instance.metadata,
                user_data=instance.user_data,
            ),
        )
        LOG.info(
            "sent instance %s to host %s (node %s, service %s) to build",
            self.instance_uuid,
            self.selection.host,
            self.selection.nodename,
            self.selection.service_uuid,
            extra={**self._log_extra, "decision": "build_sent"},
        )

    async def _instance_to_build(self) -> Instance | None:
        """The instance, if it still waits to be scheduled; None if it is gone or handled."""
        try:
            async with self.pool.acquire() as conn:
                instance = await instances.get(conn, self.instance_uuid)
        except InstanceNotFound:
            LOG.info(
                "instance %s was deleted before it was scheduled; nothing to build",
                self.instance_uuid,
                extra=self._log_extra,
            )
            return None
        if instance.vm_state != VmState.BUILDING or instance.task_state != TaskState.SCHEDULING:
            LOG.info(
                "instance %s is %s/%s, not building/scheduling: already handled, skipping",
                self.instance_uuid,
                instance.vm_state,
                instance.task_state,
                extra=self._log_extra,
            )
            return None
        return instance

    async def _record_placement(self, selection: Selection) -> bool:
        """Store host and node on the instance; False (claim released) if it was deleted."""
        async with self.pool.acquire() as conn:
            try:
                await instances.set_scheduled(
                    conn, self.instance_uuid, host=selection.host, node=selection.nodename
                )
            except InstanceNotFound:
                released = await allocations.release(conn, self.instance_uuid)
                self.selection = None
                LOG.info(
                    "instance %s was deleted while it was scheduled; released %d claim(s) "
                    "on host %s",
                    self.instance_uuid,
                    len(released),
                    selection.host,
                    extra={**self._log_extra, "decision": "claim_released"},
                )
                return False
        return True

    def _fault_message(self, exc: Exception) -> str:
        if isinstance(exc, NoValidHost):
            return exc.message
        if self.selection is None:
            detail = exc.message if isinstance(exc, KeelError) else f"{type(exc).__name__}: {exc}"
            return f"Failed to schedule the instance: {detail}."
        if isinstance(exc, MessagingError):
            return (
                f"Build of instance {self.instance_uuid} could not start: compute host "
                f"{self.selection.host} could not be reached ({exc.message})."
            )
        return f"Build of instance {self.instance_uuid} failed: {type(exc).__name__}: {exc}"

    async def rollback(self, exc: Exception) -> None:
        """Release any claim, put the instance in ERROR and close its create action."""
        message = self._fault_message(exc)
        async with self.pool.acquire() as conn, conn.transaction():
            released = await allocations.release(conn, self.instance_uuid)
            await instances.set_error(conn, self.instance_uuid, message=message, code=500)
            await instance_actions.finish(conn, self.instance_uuid, CREATE_ACTION, message)
        LOG.info(
            "instance %s is in ERROR: %s (released %d claim(s))",
            self.instance_uuid,
            message,
            len(released),
            extra={
                **self._log_extra,
                "decision": "no_valid_host" if isinstance(exc, NoValidHost) else "build_failed",
            },
        )
