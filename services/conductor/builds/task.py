"""The build workflow: schedule a new instance and hand it to the chosen compute agent.

``build_instances`` is a cast, delivered at least once — possibly twice at the same time,
or again after a conductor died half-way — so each step converges instead of repeating:

1. an instance that is no longer building is left alone (already handled, deleted, or
   put in ERROR by the build deadline);
2. while it is still *scheduling*, the scheduler is asked for a host. The scheduler is
   idempotent per instance: a twin or a retry gets the claim the first attempt made, so
   there is never a second claim;
3. the placement is recorded with a compare-and-swap (scheduling → spawning on that
   host, or already spawning there). Losing the swap because the instance was deleted or
   failed meanwhile releases the claim just made;
4. the build is cast to the agent of the recorded host — again on every delivery that
   finds the instance spawning, because a conductor that died between recording and
   casting leaves exactly that. The agent builds a guest once however often it is asked.

A business failure (no valid host, an agent whose queue is gone) releases the claims and
puts the instance in ERROR with a fault that says why. A transient failure (database or
broker trouble, a scheduler that did not answer) changes nothing: the message is tried
again by the settlement policy, and the build deadline catches what never finishes.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.conductor.boot_images import BootImages
from services.conductor.guest_data import guest_data
from services.conductor.workflow import TaskBase
from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared.context import RequestContext
from shared.db import allocations, fixed_ips, instance_actions, instances, placement, request_specs
from shared.exceptions import (
    BuildFailed,
    KeelError,
    NoValidHost,
    Unroutable,
)
from shared.faults import FaultPoints
from shared.objects.instance import Instance, RequestedDestination, RequestSpec
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
        service_down_time: float,
        requested_destination: RequestedDestination | None = None,
        faults: FaultPoints | None = None,
        boot_images: BootImages | None = None,
    ) -> None:
        self.ctx = ctx
        #: Signs the image downloads a build carries (None: it carries none).
        self.boot_images = boot_images
        self.instance_uuid = instance_uuid
        #: Where an admin asked the server to go; given to the scheduler, never stored.
        self.requested_destination = requested_destination
        self.pool = pool
        self.scheduler = scheduler
        self.compute = compute
        self.service_down_time = service_down_time
        self.faults = faults or FaultPoints()
        #: The host claimed for the instance, once known: a rollback names it.
        self.selection: Selection | None = None
        #: The instance's request spec, read with the instance (None: not read yet).
        self._spec: RequestSpec | None = None
        self._log_extra = {"instance_uuid": str(instance_uuid)}

    async def execute(self) -> None:
        instance = await self._instance_to_build()
        if instance is None:
            return
        if instance.task_state == TaskState.SCHEDULING:
            self.selection = await self._schedule()
            self.faults.reached("conductor.build.after_claim")
            instance = await self._record_placement(self.selection)
            if instance is None:
                return
            self.faults.reached("conductor.build.after_placement")
        else:
            LOG.info(
                "instance %s is already placed on %s; sending its build there again",
                self.instance_uuid,
                instance.host,
                extra=self._log_extra,
            )
            self.selection = await self._recorded_selection(instance)
        await self._send_build(instance, self.selection)

    async def _instance_to_build(self) -> Instance | None:
        """The instance, if it still waits to be scheduled or spawned; None otherwise."""
        async with self.pool.acquire() as conn:
            instance, self._spec = await request_specs.with_instance(conn, self.instance_uuid)
        if instance is None or instance.deleted_at is not None:
            LOG.info(
                "instance %s was deleted before it was built; nothing to build",
                self.instance_uuid,
                extra=self._log_extra,
            )
            return None
        building = instance.vm_state == VmState.BUILDING
        if not building or instance.task_state not in (TaskState.SCHEDULING, TaskState.SPAWNING):
            LOG.info(
                "instance %s is %s/%s, not building: already handled, skipping",
                self.instance_uuid,
                instance.vm_state,
                instance.task_state,
                extra=self._log_extra,
            )
            if not building and instance.compute_id is None:
                await self._release_unplaced_claim()
            return None
        return instance

    async def _release_unplaced_claim(self) -> None:
        """A server no longer building (an admin reset it) that was never placed holds no
        claim but the one a build cut off between its scheduling and its placement made:
        give it back (idempotent, and harmless to a twin of this build still in flight,
        which finds the server not building and gives back the same claim)."""
        async with self.pool.acquire() as conn, conn.transaction():
            current = await instances.find(conn, self.instance_uuid)
            if current is None or current.compute_id is not None:
                return
            released = await allocations.release_consumer(conn, self.instance_uuid)
        if released:
            LOG.info(
                "instance %s was never placed and is %s: released the claim its cut-off "
                "scheduling left on %s",
                self.instance_uuid,
                current.vm_state,
                ", ".join(f"node {a.compute_node_id}" for a in released),
                extra={**self._log_extra, "decision": "placement_lost"},
            )

    async def _schedule(self) -> Selection:
        spec = self._spec
        if spec is None:
            async with self.pool.acquire() as conn:
                spec = await request_specs.get(conn, self.instance_uuid)
        if self.requested_destination is not None:
            spec = spec.model_copy(update={"requested_destination": self.requested_destination})
            LOG.info(
                "scheduling instance %s on the requested destination: %s",
                self.instance_uuid,
                self.requested_destination.describe(),
                extra=self._log_extra,
            )
        return await self.scheduler.select_destinations(self.ctx, spec)

    async def _record_placement(self, selection: Selection) -> Instance | None:
        """Swap scheduling → spawning on the selected host; None if the swap was lost."""
        async with self.pool.acquire() as conn:
            # One statement: its own transaction.
            placed = await instances.set_scheduled(
                conn,
                self.instance_uuid,
                host=selection.host,
                node=selection.nodename,
                compute_id=selection.compute_node_id,
            )
        if placed is not None:
            return placed
        async with self.pool.acquire() as conn, conn.transaction():
            current = await instances.find(conn, self.instance_uuid)
            orphaned = (
                current is None
                or current.deleted_at is not None
                or (current.vm_state == VmState.ERROR and current.launched_at is None)
            )
            released = None
            if orphaned:
                released = await allocations.release(
                    conn, self.instance_uuid, selection.compute_node_id
                )
        LOG.info(
            "instance %s changed while it was scheduled (%s); %s",
            self.instance_uuid,
            "deleted" if current is None or current.deleted_at else current.vm_state,
            f"released its claim on host {selection.host}" if released else "leaving it be",
            extra={**self._log_extra, "decision": "placement_lost"},
        )
        self.selection = None
        return None

    async def _recorded_selection(self, instance: Instance) -> Selection:
        """Where a spawning instance was placed, resolved to its agent's service by id."""
        async with self.pool.acquire() as conn:
            host = await placement.host_of(conn, instance, self.service_down_time)
        if host is None:
            raise BuildFailed(
                f"compute node {instance.node} of host {instance.host} no longer exists"
            )
        return Selection(
            service_uuid=host.service.uuid,
            compute_node_id=host.node.id,
            compute_node_uuid=host.node.uuid,
            host=host.node.host,
            nodename=host.node.hypervisor_hostname,
        )

    async def _send_build(self, instance: Instance, selection: Selection) -> None:
        async with self.pool.acquire() as conn:
            addresses = await fixed_ips.for_instance(conn, self.instance_uuid)
            boot = None
            if self.boot_images is not None:
                boot = await self.boot_images.source(conn, instance.image_ref)
        spec = InstanceSpec(
            uuid=instance.uuid,
            display_name=instance.display_name,
            flavor=instance.flavor,
            image_ref=instance.image_ref,
            node=selection.nodename,
            addresses=addresses,
            metadata=instance.metadata,
            user_data=instance.user_data,
            boot=boot,
            # The guest carries its copy's token: what every later verdict compares.
            origin=instance.copy_token,
            **guest_data(instance),
        )
        try:
            await self.compute.build_and_run_instance(self.ctx, selection.service_uuid, spec)
        except Unroutable as exc:
            raise BuildFailed(
                f"compute host {selection.host} has no queue on the broker ({exc.message})"
            ) from None
        LOG.info(
            "sent instance %s to host %s (node %s, service %s) to build",
            self.instance_uuid,
            selection.host,
            selection.nodename,
            selection.service_uuid,
            extra={**self._log_extra, "decision": "build_sent"},
        )

    def _fault_message(self, exc: KeelError) -> str:
        if isinstance(exc, NoValidHost):
            return exc.message
        if self.selection is None:
            return f"Failed to schedule the instance: {exc.message}."
        return (
            f"Build of instance {self.instance_uuid} could not start on compute host "
            f"{self.selection.host}: {exc.message}."
        )

    async def rollback(self, exc: KeelError) -> None:
        """Put the instance in ERROR (if still building) and release its claims."""
        message = self._fault_message(exc)
        async with self.pool.acquire() as conn, conn.transaction():
            failed = await instances.set_build_failed(conn, self.instance_uuid, message=message)
            if failed is None:
                current = await instances.find(conn, self.instance_uuid)
                if current is None or current.deleted_at is not None:
                    await allocations.release_instance(conn, self.instance_uuid)
                LOG.info(
                    "build of instance %s failed (%s), but it is no longer building: "
                    "leaving it as it is",
                    self.instance_uuid,
                    message,
                    extra=self._log_extra,
                )
                return
            released = await allocations.release_instance(conn, self.instance_uuid)
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
