"""Shelve, offload and unshelve, as the conductor carries them out (Nova's shelve).

Every step is a compare-and-swap on the server's row (:mod:`shared.db.shelves`), so each
handler may run twice, concurrently, or be cut off between its awaits:

* **the shelve's result** (``instance_action_result`` ``shelve``): on success the server
  is SHELVED; with ``KEEL_SHELVED_OFFLOAD_TIME`` = 0 it moves in the same statement to
  task ``shelving_offloading`` with its copy token replaced by one no guest carries (so
  its guest is no longer its current copy), and only then is its agent asked to destroy
  the guest (``shelve_offload_instance``; a broker failure then has the result delivered
  again, which finds the server offloading and asks again). A failure clears the task
  (the server as it was) and kills the unfinished image; a failure reported once the
  image is whole (a repeated delivery refused its second upload) changes nothing;
* **the offload's result**: SHELVED_OFFLOADED, host and node cleared, claims released.
  A repeat changes nothing; a result that lost its message is replaced by the deadline;
* **an unshelve of a SHELVED server** (``unshelve``): its guest powered on; ACTIVE;
* **an unshelve of an offloaded server** (``unshelve_instance``, :class:`UnshelveTask`):
  scheduled as a build is (scheduler, claim, server group, zone, requested host), placed
  (task ``spawning``) and built from the shelved image with the copy token keel-api gave
  it; the build's success makes it ACTIVE, deletes the shelved image and removes the
  system metadata keys. No valid host, a failed spawn or the deadline send it back to
  SHELVED_OFFLOADED with a fault and its instance action in error, claim released.

:class:`ShelveDeadline` (in the conductors' deadline sweep) ends what never finished: a
shelve or an in-place unshelve past ``KEEL_TASK_TIMEOUT`` (the server as it was), an
offload past it (completed: the guest is no longer the server's copy; if its agent
destroyed nothing, the host reports it as an orphan), an unshelve build past
``KEEL_BUILD_TIMEOUT`` (back to SHELVED_OFFLOADED), and, with a positive
``KEEL_SHELVED_OFFLOAD_TIME``, offloads servers shelved for longer than that.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.boot_images import BootImages
from services.conductor.builds.task import BuildInstanceTask
from services.conductor.rpcapi import InstanceActionResult, InstanceBuildResult, PowerAction
from services.scheduler.rpcapi import SchedulerAPI, Selection
from shared.context import RequestContext
from shared.db import (
    allocations,
    images,
    instance_actions,
    instances,
    placement,
    request_specs,
    shelves,
)
from shared.db.pool import Connection
from shared.exceptions import (
    ImageNotFound,
    KeelError,
    MessagingError,
    NoValidHost,
    ServiceTooOld,
    Unroutable,
)
from shared.faults import FaultPoints
from shared.objects.instance import Instance, RequestedDestination
from shared.objects.states import TaskState, VmState
from shared.rpc.settlement import is_transient

LOG = logging.getLogger(__name__)

#: The instance actions, as Nova names them.
SHELVE_ACTION = "shelve"
OFFLOAD_ACTION = "shelveOffload"
UNSHELVE_ACTION = "unshelve"


def _extra(instance_uuid: UUID, decision: str | None = None) -> dict[str, str]:
    extra = {"instance_uuid": str(instance_uuid)}
    if decision is not None:
        extra["decision"] = decision
    return extra


async def send_offload(
    pool: asyncpg.Pool,
    compute: ComputeAPI,
    ctx: RequestContext,
    instance: Instance,
    down: float,
    *,
    retry: bool = False,
) -> bool:
    """Ask the agent of ``instance``'s host to destroy its guest (the server is offloading);
    False if it could not be asked (the offload deadline completes it then). ``retry``: a
    broker failure is raised instead, so the message that led here is delivered again
    (and, finding the server offloading, asks again)."""
    async with pool.acquire() as conn:
        host = await placement.host_of(conn, instance, down)
    if host is None:
        LOG.warning(
            "server %s is offloading, but its host %s has no compute service: its offload "
            "completes at its deadline",
            instance.uuid,
            instance.host,
            extra=_extra(instance.uuid),
        )
        return False
    try:
        await compute.shelve_offload_instance(ctx, host.service.uuid, instance.uuid)
    except (MessagingError, ServiceTooOld) as exc:
        if retry and not isinstance(exc, Unroutable | ServiceTooOld) and is_transient(exc):
            raise
        LOG.warning(
            "could not ask host %s to destroy the guest of offloading server %s (%s): its "
            "offload completes at its deadline",
            host.node.host,
            instance.uuid,
            exc.message,
            extra=_extra(instance.uuid),
        )
        return False
    LOG.info(
        "asked host %s to destroy the guest of shelved server %s (offload)",
        host.node.host,
        instance.uuid,
        extra=_extra(instance.uuid, "offload_sent"),
    )
    return True


class Shelving:
    """The conductor's side of shelve, offload and unshelve (see the module docstring)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        compute: ComputeAPI,
        *,
        offload_time: float,
        service_down_time: float,
        faults: FaultPoints | None = None,
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.offload_time = offload_time
        self.down = service_down_time
        self.faults = faults or FaultPoints()

    async def record_result(self, ctx: RequestContext, req: InstanceActionResult) -> None:
        """A shelve's, an offload's or an in-place unshelve's result."""
        if req.action is PowerAction.SHELVE:
            await self._shelve_result(ctx, req)
        elif req.action is PowerAction.SHELVE_OFFLOAD:
            await record_offloaded(self.pool, req.instance_uuid, req.message or None)
        else:
            await self._unshelve_result(req)

    async def _shelve_result(self, ctx: RequestContext, req: InstanceActionResult) -> None:
        uuid_ = req.instance_uuid
        if not req.success:
            await self._shelve_failed(req)
            return
        offload = self.offload_time == 0
        async with self.pool.acquire() as conn, conn.transaction():
            done = await shelves.shelved(conn, uuid_, offload=offload)
            if done is not None and not offload:
                await instance_actions.finish(conn, uuid_, SHELVE_ACTION)
            current = done or await instances.find(conn, uuid_)
        if done is None:
            if (
                current is not None
                and current.deleted_at is None
                and current.task_state == TaskState.SHELVING_OFFLOADING
            ):
                # A repeat of a result whose offload may never have been asked for (its
                # conductor was cut off after the commit): ask again; the agent's
                # destroy is idempotent.
                await send_offload(self.pool, self.compute, ctx, current, self.down, retry=True)
                return
            LOG.info(
                "ignoring the shelve result for server %s: it is no longer shelving "
                "(already handled)",
                uuid_,
                extra=_extra(uuid_),
            )
            return
        LOG.info(
            "server %s is shelved on host %s%s",
            uuid_,
            done.host,
            "; offloading it at once" if offload else "",
            extra=_extra(uuid_, "shelved"),
        )
        if offload:
            self.faults.reached("conductor.shelve.offload_begun")
            await send_offload(self.pool, self.compute, ctx, done, self.down, retry=True)

    async def _shelve_failed(self, req: InstanceActionResult) -> None:
        uuid_ = req.instance_uuid
        async with self.pool.acquire() as conn, conn.transaction():
            current = await instances.find(conn, uuid_)
            image_id = None if current is None else shelves.shelved_image(current)
            if image_id is not None and await _whole(conn, image_id):
                LOG.info(
                    "ignoring a failed shelve result for server %s (%s): its shelved image "
                    "%s is whole, so this is a repeated delivery's",
                    uuid_,
                    req.message,
                    image_id,
                    extra=_extra(uuid_),
                )
                return
            done = await shelves.failed(conn, uuid_)
            if done is not None:
                await instance_actions.finish(conn, uuid_, SHELVE_ACTION, req.message)
        if done is None:
            LOG.info(
                "ignoring the shelve result for server %s: it is no longer shelving",
                uuid_,
                extra=_extra(uuid_),
            )
            return
        LOG.warning(
            "shelve of server %s failed: %s; it stays %s",
            uuid_,
            req.message,
            done.vm_state,
            extra=_extra(uuid_, "shelve_failed"),
        )

    async def _unshelve_result(self, req: InstanceActionResult) -> None:
        uuid_ = req.instance_uuid
        async with self.pool.acquire() as conn, conn.transaction():
            if req.success:
                ended = await shelves.unshelved(conn, uuid_)
                done = None if ended is None else ended[0]
            else:
                done = await shelves.end_unshelve_in_place(conn, uuid_)
            if done is not None:
                await instance_actions.finish(
                    conn, uuid_, UNSHELVE_ACTION, None if req.success else req.message
                )
        if done is None:
            LOG.info(
                "ignoring the unshelve result for server %s: it is no longer unshelving",
                uuid_,
                extra=_extra(uuid_),
            )
        elif req.success:
            LOG.info(
                "server %s is unshelved on host %s",
                uuid_,
                done.host,
                extra=_extra(uuid_, "unshelved"),
            )
        else:
            LOG.warning(
                "unshelve of server %s failed: %s; it stays SHELVED",
                uuid_,
                req.message,
                extra=_extra(uuid_, "unshelve_failed"),
            )


async def _whole(conn: Connection, image_id: UUID) -> bool:
    try:
        image = await images.get(conn, image_id)
    except ImageNotFound:
        return False
    return image.status == "active"


async def record_offloaded(
    pool: asyncpg.Pool, instance_uuid: UUID, message: str | None = None
) -> bool:
    """End an offload: SHELVED_OFFLOADED, claims released (idempotent). ``message``: what
    went wrong, if the guest may still be on its host (it is not the server's copy any
    more: its host reports it as an orphan). False if the server was not offloading."""
    async with pool.acquire() as conn, conn.transaction():
        ended = await shelves.offloaded(conn, instance_uuid)
        if ended is not None:
            await instance_actions.finish(conn, instance_uuid, SHELVE_ACTION, message)
            await instance_actions.finish(conn, instance_uuid, OFFLOAD_ACTION, message)
    if ended is None:
        LOG.info(
            "ignoring the offload result for server %s: it is no longer offloading",
            instance_uuid,
            extra=_extra(instance_uuid),
        )
        return False
    _, released = ended
    LOG.info(
        "server %s is shelved and offloaded; released %d claim(s)%s",
        instance_uuid,
        len(released),
        f" ({message})" if message else "",
        extra=_extra(instance_uuid, "offloaded"),
    )
    return True


async def record_unshelve_build(pool: asyncpg.Pool, req: InstanceBuildResult) -> None:
    """The result of an unshelve's build on the server's new host."""
    uuid_ = req.instance_uuid
    async with pool.acquire() as conn, conn.transaction():
        if req.success:
            ended = await shelves.unshelved(conn, uuid_)
            done = None if ended is None else ended[0]
            image_id = None if ended is None else ended[1]
            message = None
        else:
            message = req.message or f"Unshelve of instance {uuid_} failed."
            back = await shelves.back_to_offloaded(conn, uuid_, message)
            done = None if back is None else back[0]
            image_id = None
        if done is not None:
            await instance_actions.finish(conn, uuid_, UNSHELVE_ACTION, message)
    if done is None:
        LOG.info(
            "ignoring a build result for server %s: it is no longer unshelving",
            uuid_,
            extra=_extra(uuid_),
        )
    elif message is None:
        LOG.info(
            "server %s is unshelved on host %s; its shelved image %s is deleted",
            uuid_,
            done.host,
            image_id,
            extra=_extra(uuid_, "unshelved"),
        )
    else:
        LOG.warning(
            "unshelve of server %s failed on its new host: %s; it is SHELVED_OFFLOADED again",
            uuid_,
            message,
            extra=_extra(uuid_, "unshelve_failed"),
        )


class UnshelveTask(BuildInstanceTask):
    """Schedule a shelved and offloaded server again and build it from its shelved image.

    The steps converge as a build's do (:mod:`services.conductor.builds.task`): while the
    server is ``unshelving`` the scheduler is asked (a twin gets the claim the first
    attempt made), the placement recorded (``spawning``), and the build sent to the
    recorded host on every delivery that finds it spawning.
    """

    name = "unshelve"

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
        super().__init__(
            ctx,
            instance_uuid,
            pool=pool,
            scheduler=scheduler,
            compute=compute,
            service_down_time=service_down_time,
            requested_destination=requested_destination,
            faults=faults,
            boot_images=boot_images,
        )

    async def execute(self) -> None:
        async with self.pool.acquire() as conn:
            instance = await instances.find(conn, self.instance_uuid)
        if (
            instance is None
            or instance.deleted_at is not None
            or instance.vm_state != VmState.SHELVED_OFFLOADED
            or instance.task_state not in shelves.UNSHELVE_BUILD_TASKS
        ):
            LOG.info(
                "server %s is no longer waiting to be unshelved; nothing to do",
                self.instance_uuid,
                extra=self._log_extra,
            )
            if instance is not None and instance.compute_id is None:
                await self._release_unplaced_claim()
            return
        image_id = shelves.shelved_image(instance)
        if image_id is None:
            raise KeelError(f"server {self.instance_uuid} has no shelved image to unshelve from")
        if instance.task_state == TaskState.UNSHELVING:
            self.selection = await self._schedule_again(instance)
            placed = await self._place(self.selection)
            if placed is None:
                return
            instance = placed
            self.faults.reached("conductor.unshelve.after_placement")
        else:
            self.selection = await self._recorded_selection(instance)
        # The guest is built from the shelved image; the server keeps its image_ref.
        from_shelved = instance.model_copy(update={"image_ref": str(image_id)})
        await self._send_build(from_shelved, self.selection)

    async def _schedule_again(self, instance: Instance) -> Selection:
        async with self.pool.acquire() as conn:
            spec = await request_specs.get(conn, self.instance_uuid)
        spec = spec.model_copy(
            update={
                "flavor": instance.flavor,
                "ignore_nodes": [],
                "requested_destination": self.requested_destination,
            }
        )
        return await self.scheduler.select_destinations(self.ctx, spec)

    async def _place(self, selection: Selection) -> Instance | None:
        async with self.pool.acquire() as conn, conn.transaction():
            placed = await shelves.placed(
                conn,
                self.instance_uuid,
                host=selection.host,
                node=selection.nodename,
                compute_id=selection.compute_node_id,
            )
            if placed is not None:
                return placed
            current = await instances.find(conn, self.instance_uuid)
            orphaned = (
                current is None or current.deleted_at is not None or current.compute_id is None
            )
            if orphaned:
                await allocations.release(conn, self.instance_uuid, selection.compute_node_id)
        LOG.info(
            "server %s changed while it was scheduled for its unshelve; %s",
            self.instance_uuid,
            f"released its claim on {selection.host}" if orphaned else "leaving it be",
            extra={**self._log_extra, "decision": "placement_lost"},
        )
        self.selection = None
        return None

    async def rollback(self, exc: KeelError) -> None:
        """SHELVED_OFFLOADED again, with the fault and the action's error; claims released."""
        message = self._fault_message(exc)
        async with self.pool.acquire() as conn, conn.transaction():
            back = await shelves.back_to_offloaded(conn, self.instance_uuid, message)
            if back is not None:
                await instance_actions.finish(conn, self.instance_uuid, UNSHELVE_ACTION, message)
            else:
                current = await instances.find(conn, self.instance_uuid)
                if current is None or current.deleted_at is not None:
                    await allocations.release_instance(conn, self.instance_uuid)
        if back is None:
            LOG.info(
                "unshelve of server %s failed (%s), but it is no longer unshelving",
                self.instance_uuid,
                message,
                extra=self._log_extra,
            )
            return
        LOG.warning(
            "unshelve of server %s failed: %s; it is SHELVED_OFFLOADED again (released %d "
            "claim(s))",
            self.instance_uuid,
            message,
            len(back[1]),
            extra={
                **self._log_extra,
                "decision": "no_valid_host" if isinstance(exc, NoValidHost) else "unshelve_failed",
            },
        )


class ShelveDeadline:
    """Ends the shelves, offloads and unshelves that never finished; offloads servers
    shelved for longer than ``KEEL_SHELVED_OFFLOAD_TIME`` when it is positive."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        compute: ComputeAPI,
        *,
        task_timeout: float,
        build_timeout: float,
        offload_time: float,
        down_time: float,
    ) -> None:
        self.pool = pool
        self.compute = compute
        self.task_timeout = task_timeout
        self.build_timeout = build_timeout
        self.offload_time = offload_time
        self.down = down_time

    async def _overdue(
        self, task: TaskState, vm_states: tuple[VmState, ...], seconds: float
    ) -> list[UUID]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                """SELECT uuid FROM instances
                    WHERE deleted_at IS NULL AND task_state = $1 AND vm_state = ANY($2::text[])
                      AND updated_at < now() - make_interval(secs => $3)
                    ORDER BY id LIMIT 100""",
                task.value,
                [vm.value for vm in vm_states],
                seconds,
            )
        return [row["uuid"] for row in rows]

    async def sweep(self) -> int:
        done = 0
        why = "timed out: no agent finished it within {:g}s ({})"
        if self.task_timeout > 0:
            message = why.format(self.task_timeout, "KEEL_TASK_TIMEOUT")
            for uuid_ in await self._overdue(
                TaskState.SHELVING, shelves.SHELVABLE, self.task_timeout
            ):
                async with self.pool.acquire() as conn, conn.transaction():
                    ended = await shelves.failed(conn, uuid_)
                    if ended is not None:
                        await instance_actions.finish(conn, uuid_, SHELVE_ACTION, message)
                done += self._told(ended is not None, uuid_, "shelve", "left as it was")
            for uuid_ in await self._overdue(
                TaskState.SHELVING_OFFLOADING, (VmState.SHELVED,), self.task_timeout
            ):
                ended_ = await record_offloaded(self.pool, uuid_, message)
                done += self._told(ended_, uuid_, "offload", "completed")
            for uuid_ in await self._overdue(
                TaskState.UNSHELVING, (VmState.SHELVED,), self.task_timeout
            ):
                async with self.pool.acquire() as conn, conn.transaction():
                    back = await shelves.end_unshelve_in_place(conn, uuid_)
                    if back is not None:
                        await instance_actions.finish(conn, uuid_, UNSHELVE_ACTION, message)
                done += self._told(back is not None, uuid_, "unshelve", "SHELVED again")
        if self.build_timeout > 0:
            message = why.format(self.build_timeout, "KEEL_BUILD_TIMEOUT")
            for task in shelves.UNSHELVE_BUILD_TASKS:
                for uuid_ in await self._overdue(
                    task, (VmState.SHELVED_OFFLOADED,), self.build_timeout
                ):
                    async with self.pool.acquire() as conn, conn.transaction():
                        gone = await shelves.back_to_offloaded(conn, uuid_, message)
                        if gone is not None:
                            await instance_actions.finish(conn, uuid_, UNSHELVE_ACTION, message)
                    done += self._told(
                        gone is not None, uuid_, "unshelve", "SHELVED_OFFLOADED again"
                    )
        if self.offload_time > 0:
            done += await self._offload_shelved()
        return done

    def _told(self, ended: bool, instance_uuid: UUID, what: str, outcome: str) -> int:
        if ended:
            LOG.warning(
                "the %s of server %s did not finish in time: %s",
                what,
                instance_uuid,
                outcome,
                extra=_extra(instance_uuid, f"{what}_timed_out"),
            )
        return int(ended)

    async def _offload_shelved(self) -> int:
        """Offload the servers SHELVED for longer than the offload time."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                """SELECT uuid FROM instances
                    WHERE deleted_at IS NULL AND vm_state = $1 AND task_state IS NULL
                      AND COALESCE((system_metadata->>$2)::timestamptz, updated_at)
                          < now() - make_interval(secs => $3)
                    ORDER BY id LIMIT 100""",
                VmState.SHELVED.value,
                shelves.AT_KEY,
                self.offload_time,
            )
        done = 0
        for row in rows:
            ctx = RequestContext.internal()
            async with self.pool.acquire() as conn, conn.transaction():
                begun = await shelves.begin_offload(conn, row["uuid"])
                if begun is not None:
                    await instance_actions.start(conn, ctx, begun.uuid, OFFLOAD_ACTION)
            if begun is None:
                continue
            done += 1
            LOG.info(
                "server %s has been shelved for %gs (KEEL_SHELVED_OFFLOAD_TIME): offloading it",
                begun.uuid,
                self.offload_time,
                extra=_extra(begun.uuid, "offload_due"),
            )
            await send_offload(self.pool, self.compute, ctx, begun, self.down)
        return done
