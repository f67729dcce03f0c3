"""The RPC endpoint of keel-compute, served on ``compute.<service uuid>``.

Both methods are casts, delivered at least once, so both are idempotent: a build of a
guest that already exists reports success again, a terminate of a guest that is gone
reports it deleted again. Operations on one guest run one at a time
(:class:`~services.compute.inflight.InFlight`). Results go back to the conductor, the
agent's only path to the database.

A build message may arrive late: redelivered after the instance was deleted, or after
the build deadline gave up on it. So the agent asks the conductor whether the build is
still wanted on this node before it creates the guest and again after, and removes what
it created if the answer changed (``check_build``; a conductor too old to answer is
taken as a yes). A move's rebuild asks the same of its move (``check_move``): delivered
after the move deadline ended the move, it builds nothing.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol
from uuid import UUID

from services.compute.inflight import InFlight
from services.compute.live import LiveMigrationHandlers
from services.compute.rpcapi import (
    BuildAndRunInstance,
    ConsoleOutput,
    FinishRevert,
    GetConsoleOutput,
    GetHostUptime,
    GetInstanceDiagnostics,
    GuestAction,
    GuestDiagnostics,
    HostUptime,
    InstanceSpec,
    PreparedMigration,
    PrepareMigration,
    RebootInstance,
    RebootType,
    RebuildGuest,
    RebuildInstance,
    RemoveMovedGuest,
    ShelveInstance,
    SnapshotInstance,
    StartInstance,
    StopInstance,
    TerminateInstance,
)
from services.compute.snapshot_upload import upload
from services.compute.uptime import host_uptime
from services.compute.virt.driver import Driver
from services.conductor.rpcapi import BuildVerdict, ConductorAPI, CopyToken, PowerAction
from shared.context import RequestContext
from shared.exceptions import GuestNotFound, KeelError, MessagingError, TransientError
from shared.faults import FaultPoints
from shared.rpc.settlement import is_transient

LOG = logging.getLogger(__name__)


def _extra(instance_uuid: UUID) -> dict[str, str]:
    return {"instance_uuid": str(instance_uuid)}


def tail_lines(log: bytes, count: int | None) -> bytes:
    """The last ``count`` lines of ``log`` (all of it for ``None``), cut as Nova cuts them.

    Nova splits on newlines and joins the last ``count`` pieces, so a log ending with a
    newline yields ``count - 1`` lines and an empty last piece: clients count lines with
    ``output.split("\\n")`` and expect exactly ``count``.
    """
    if count is None:
        return log
    if count == 0:
        return b""
    return b"\n".join(log.split(b"\n")[-count:])


class Gate(Protocol):
    """Whether the agent may start guests now (:class:`~services.compute.contact.ContactWatch`)."""

    def serving(self) -> bool: ...

    async def wait_serving(self, what: str, instance_uuid: UUID) -> None: ...

    async def wait_answered(self) -> None:
        """Until a heartbeat is answered again (or a while has passed: try again)."""
        ...


class ComputeManager(LiveMigrationHandlers):
    def __init__(
        self,
        driver: Driver,
        conductor: ConductorAPI,
        *,
        node_uuid: UUID,
        faults: FaultPoints | None = None,
        gate: Gate | None = None,
        live_migration_seconds: float = 2.0,
    ) -> None:
        self.live_migration_seconds = live_migration_seconds
        self._driver = driver
        self._conductor = conductor
        self._node_uuid = node_uuid
        self._faults = faults or FaultPoints()
        self._gate = gate
        #: One operation at a time per guest; others that touch guests hold it too.
        self.operations = InFlight()

    @asynccontextmanager
    async def _may_start(self, instance_uuid: UUID, operation: str) -> AsyncIterator[None]:
        """Hold the guest's slot for an operation that may start it, once the agent serves.

        After a loss of contact the agent starts nothing before its guests are reconciled
        (:mod:`services.compute.contact`); the wait is outside the slot, which the
        reconcile itself may need, and the gate is looked at again once the slot is held.
        """
        while True:
            if self._gate is not None:
                await self._gate.wait_serving(operation, instance_uuid)
            async with self.operations.hold(instance_uuid, operation):
                if self._gate is None or self._gate.serving():
                    yield
                    return

    def in_flight(self) -> dict[UUID, str]:
        """Guest → the operation running on it now (what a stopping agent drains)."""
        return self.operations.operations()

    async def build_and_run_instance(self, ctx: RequestContext, req: BuildAndRunInstance) -> None:
        spec = req.instance
        async with self._may_start(spec.uuid, "build"):
            existed = spec.uuid in await self._driver.list_instances()
            have = await self._token_of(spec.uuid) if existed else None
            #: The token of the guest this delivery builds (its spec's).
            built = CopyToken(token=spec.origin)
            verdict = await self._verdict(ctx, spec.uuid, "before building", have)
            if verdict is BuildVerdict.ABANDON and existed:
                await self._discard(spec.uuid, "a build nobody wants any more left it")
                if have is not None and have.token != spec.origin:
                    # That guest was another copy (one an offload left, say), not this
                    # build's: this build may still be wanted. Ask again, with none here.
                    existed, have = False, None
                    verdict = await self._verdict(ctx, spec.uuid, "before building", None)
            if verdict is not BuildVerdict.BUILD:
                return
            if existed:
                LOG.info(
                    "guest %s already exists: the build was repeated; reporting success again",
                    spec.uuid,
                    extra=_extra(spec.uuid),
                )
            else:
                self._faults.reached("compute.build.before_spawn")
                error = await self._spawn(spec)
                if error is not None:
                    await self._conductor.instance_build_result(
                        ctx, spec.uuid, success=False, message=error, built=built
                    )
                    return
                self._faults.reached("compute.build.after_spawn")
                after = await self._verdict(ctx, spec.uuid, "after building", built)
                if after is not BuildVerdict.BUILD:
                    await self._discard(spec.uuid, "its build was given up while it ran")
                    return
                LOG.info("guest %s is running", spec.uuid, extra=_extra(spec.uuid))
            await self._conductor.instance_build_result(
                ctx, spec.uuid, success=True, built=have or built
            )

    async def _token_of(self, instance_uuid: UUID) -> CopyToken | None:
        """The copy token the guest here carries (``None`` if it went meanwhile)."""
        try:
            return CopyToken(token=await self._driver.origin(instance_uuid))
        except GuestNotFound:
            return None

    async def _verdict(
        self, ctx: RequestContext, instance_uuid: UUID, when: str, guest: CopyToken | None
    ) -> BuildVerdict:
        """Ask the conductor whether this node should (still) build the guest; ``guest``:
        the token of the guest already here, if any."""
        check = await self._conductor.check_build(ctx, instance_uuid, self._node_uuid, guest)
        if check is None:
            return BuildVerdict.BUILD
        if check.verdict is not BuildVerdict.BUILD:
            LOG.info(
                "not building guest %s (checked %s): %s",
                instance_uuid,
                when,
                check.reason,
                extra={**_extra(instance_uuid), "decision": f"build_{check.verdict.value}"},
            )
        return check.verdict

    async def _spawn(self, spec: InstanceSpec) -> str | None:
        """Build the guest; on failure remove what was made and return why it failed."""
        flavor = spec.flavor
        addresses = ", ".join(ip.address for ip in spec.addresses) or "none given"
        LOG.info(
            "building guest %s (%s) with flavor %s: %d vCPU, %d MB RAM, %d GB disk; "
            "addresses: %s; metadata items: %d; user data: %s",
            spec.uuid,
            spec.display_name,
            flavor.name,
            flavor.vcpus,
            flavor.memory_mb,
            flavor.root_gb,
            addresses,
            len(spec.metadata),
            "given" if spec.user_data else "none",
            extra=_extra(spec.uuid),
        )
        try:
            await self._driver.spawn(spec)
        except KeelError as exc:
            message = exc.message
            LOG.warning("build of %s failed: %s", spec.uuid, message, extra=_extra(spec.uuid))
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            LOG.exception("build of %s failed unexpectedly", spec.uuid, extra=_extra(spec.uuid))
        else:
            return None
        await self._discard(spec.uuid, "its build failed")
        return message

    async def _discard(self, instance_uuid: UUID, why: str) -> None:
        """Remove a guest this agent built for nothing; a failure is logged, not raised."""
        try:
            await self._driver.destroy(instance_uuid)
        except Exception:
            LOG.exception(
                "could not remove guest %s (%s)", instance_uuid, why, extra=_extra(instance_uuid)
            )
        else:
            LOG.info("removed guest %s: %s", instance_uuid, why, extra=_extra(instance_uuid))

    async def terminate_instance(self, ctx: RequestContext, req: TerminateInstance) -> None:
        instance_uuid = req.instance_uuid
        async with self.operations.hold(instance_uuid, "terminate"):
            if not await self._taken(ctx, instance_uuid, "terminate"):
                return
            existed = instance_uuid in await self._driver.list_instances()
            await self._driver.destroy(instance_uuid)
            if existed:
                LOG.info("guest %s destroyed", instance_uuid, extra=_extra(instance_uuid))
            else:
                LOG.info(
                    "guest %s does not exist on this host; reporting it deleted",
                    instance_uuid,
                    extra=_extra(instance_uuid),
                )
            await self._conductor.instance_deleted(ctx, instance_uuid)

    async def stop_instance(self, ctx: RequestContext, req: StopInstance) -> None:
        await self._power(ctx, req.instance_uuid, PowerAction.STOP, self._driver.power_off)

    async def start_instance(self, ctx: RequestContext, req: StartInstance) -> None:
        await self._power(
            ctx, req.instance_uuid, PowerAction.START, self._driver.power_on, starts=True
        )

    async def pause_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self._power(ctx, req.instance_uuid, PowerAction.PAUSE, self._driver.pause)

    async def unpause_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self._power(
            ctx, req.instance_uuid, PowerAction.UNPAUSE, self._driver.unpause, starts=True
        )

    async def suspend_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self._power(ctx, req.instance_uuid, PowerAction.SUSPEND, self._driver.suspend)

    async def resume_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        await self._power(
            ctx, req.instance_uuid, PowerAction.RESUME, self._driver.resume, starts=True
        )

    async def soft_delete_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        """Power off the guest of a server deleted with soft delete on; it is kept."""
        await self._power(ctx, req.instance_uuid, PowerAction.SOFT_DELETE, self._driver.power_off)

    async def restore_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        """Power on the guest of a restored server."""
        await self._power(
            ctx, req.instance_uuid, PowerAction.RESTORE, self._driver.power_on, starts=True
        )

    async def get_host_uptime(self, ctx: RequestContext, req: GetHostUptime) -> HostUptime:
        """This host's uptime line (read-only: no guest is involved)."""
        try:
            line = await asyncio.to_thread(host_uptime)
        except OSError as exc:
            raise KeelError(f"the host's uptime cannot be read: {exc}") from None
        return HostUptime(uptime=line)

    async def reboot_instance(self, ctx: RequestContext, req: RebootInstance) -> None:
        hard = req.reboot_type is RebootType.HARD

        async def reboot(instance_uuid: UUID) -> None:
            await self._driver.reboot(instance_uuid, hard=hard)

        await self._power(ctx, req.instance_uuid, PowerAction.REBOOT, reboot, starts=True)

    async def rebuild_guest(self, ctx: RequestContext, req: RebuildGuest) -> None:
        """The ``rebuild`` action: make the server's guest here again from a new image.

        Taken only while that rebuild is under way on this node: a delivery after it
        ended (or after the server left this host) changes nothing. Repeated while under
        way, it makes the guest again; the result ends the task once.
        """
        spec = req.instance
        async with self._may_start(spec.uuid, "rebuild in place"):
            if not await self._taken(
                ctx, spec.uuid, "rebuild", task="rebuild_spawning", node=self._node_uuid
            ):
                return
            message: str | None = None
            try:
                if spec.uuid in await self._driver.list_instances():
                    await self._driver.destroy(spec.uuid)
                self._faults.reached("compute.rebuild_guest.destroyed")
                await self._driver.spawn(spec)
                if req.powered_off:
                    await self._driver.power_off(spec.uuid)
            except KeelError as exc:
                message = exc.message
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                LOG.exception("rebuild of guest %s failed unexpectedly", spec.uuid)
            if message is not None:
                LOG.warning(
                    "rebuild of guest %s from image %s failed: %s",
                    spec.uuid,
                    spec.image_ref,
                    message,
                    extra=_extra(spec.uuid),
                )
                await self._discard(spec.uuid, "its rebuild failed")
            else:
                LOG.info(
                    "guest %s rebuilt from image %s%s",
                    spec.uuid,
                    spec.image_ref,
                    " (left shut down)" if req.powered_off else "",
                    extra=_extra(spec.uuid),
                )
            await self._conductor.instance_action_result(
                ctx,
                spec.uuid,
                PowerAction.REBUILD,
                success=message is None,
                message=message or "",
            )

    async def snapshot_instance(self, ctx: RequestContext, req: SnapshotInstance) -> None:
        """A snapshot: the guest's disk written into the image through the upload URL.

        Taken only while the server's snapshot is under way on this node (any of its
        steps: a delivery after the agent was cut off mid-upload writes it again; one
        after the snapshot ended does nothing). The guest is left as it was.
        """
        uuid = req.instance_uuid
        async with self.operations.hold(uuid, "snapshot"):
            if not await self._taken(
                ctx, uuid, "snapshot", task="image_snapshot", node=self._node_uuid
            ):
                return
            message = await self._write_image(req, "snapshot")
            await self._conductor.instance_action_result(
                ctx, uuid, PowerAction.SNAPSHOT, success=message is None, message=message or ""
            )

    async def shelve_instance(self, ctx: RequestContext, req: ShelveInstance) -> None:
        """A shelve: the guest powered off, then its disk written into the shelved image.

        Taken only while the server's shelve is under way on this node; the guest is
        kept (an offload, which the conductor decides, destroys it later). Repeated, it
        writes the image again if it is not whole yet.
        """
        uuid = req.instance_uuid
        async with self.operations.hold(uuid, "shelve"):
            if not await self._taken(ctx, uuid, "shelve", task="shelving", node=self._node_uuid):
                return
            message: str | None = None
            try:
                await self._driver.power_off(uuid)
            except KeelError as exc:
                message = exc.message
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                LOG.exception("shelve of guest %s failed unexpectedly", uuid, extra=_extra(uuid))
            if message is None:
                self._faults.reached("compute.shelve.powered_off")
                message = await self._write_image(req, "shelve")
            await self._conductor.instance_action_result(
                ctx, uuid, PowerAction.SHELVE, success=message is None, message=message or ""
            )

    async def shelve_offload_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        """An offload: destroy the guest of a shelved server.

        Taken only while the server is offloading from this node: the conductor cleared
        its copy token when the offload began, so this guest is no longer its current
        copy; the shelved image holds its disk. Repeated, it finds the guest gone.
        """
        uuid = req.instance_uuid
        async with self.operations.hold(uuid, "shelve offload"):
            if not await self._taken(
                ctx, uuid, "shelve offload", task="shelving_offloading", node=self._node_uuid
            ):
                return
            message: str | None = None
            try:
                await self._driver.destroy(uuid)
            except KeelError as exc:
                message = exc.message
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                LOG.exception("offload of guest %s failed unexpectedly", uuid, extra=_extra(uuid))
            if message is None:
                LOG.info("guest %s destroyed: its server is shelved and offloaded", uuid,
                         extra={**_extra(uuid), "decision": "guest_offloaded"})  # fmt: skip
            await self._conductor.instance_action_result(
                ctx,
                uuid,
                PowerAction.SHELVE_OFFLOAD,
                success=message is None,
                message=message or "",
            )

    async def unshelve_instance(self, ctx: RequestContext, req: GuestAction) -> None:
        """Power the guest of a shelved (not offloaded) server on again."""
        await self._power(
            ctx, req.instance_uuid, PowerAction.UNSHELVE, self._driver.power_on, starts=True
        )

    async def _write_image(self, req: SnapshotInstance, what: str) -> str | None:
        """Write the guest's disk into ``req``'s image; why it failed, or ``None``."""
        uuid = req.instance_uuid
        message: str | None = None
        try:
            with tempfile.TemporaryDirectory(prefix=f"keel-{what}-") as scratch:
                data = Path(scratch) / "disk"
                await self._driver.snapshot(uuid, data, req.disk_format)
                self._faults.reached(f"compute.{what}.before_upload")
                size = await asyncio.to_thread(upload, req.upload_url, data)
        except KeelError as exc:
            message = exc.message
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            LOG.exception("%s of guest %s failed unexpectedly", what, uuid, extra=_extra(uuid))
        if message is None:
            LOG.info(
                "guest %s: %s written into image %s (%d bytes, %s)",
                uuid,
                what,
                req.image_id,
                size,
                req.disk_format,
                extra=_extra(uuid),
            )
        else:
            LOG.warning(
                "%s of guest %s into image %s failed: %s",
                what,
                uuid,
                req.image_id,
                message,
                extra=_extra(uuid),
            )
        return message

    async def _taken(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        what: str,
        *,
        task: str | None = None,
        node: UUID | None = None,
    ) -> bool:
        """Take keel-api's request before acting on it; False if keel-api withdrew it.

        keel-api withdraws a request whose message it could not confirm sent, and
        answers 503: that message may still arrive here, and must then change nothing.
        So nothing is done before a conductor has answered: while none can (all down,
        or the database unreachable), the request waits here, its message unsettled,
        and is taken once heartbeats are answered again (a message redelivered meanwhile
        waits likewise). Without a contact watch to wait on, the failure is transient:
        the message is tried again later.
        """
        told = False
        while True:
            try:
                taken = await self._conductor.take_request(
                    ctx, instance_uuid, task=task, node_uuid=node
                )
                break
            except MessagingError as exc:
                if not is_transient(exc):
                    raise
                if self._gate is None:
                    raise TransientError(
                        f"no conductor took request {ctx.request_id} ({exc.message})"
                    ) from None
                if not told:
                    LOG.warning(
                        "%s of guest %s waits: no conductor answered whether request %s "
                        "may act (%s); nothing is done before one does",
                        what,
                        instance_uuid,
                        ctx.request_id,
                        exc.message,
                        extra={**_extra(instance_uuid), "decision": "waiting_to_take"},
                    )
                    told = True
                await self._gate.wait_answered()
        if taken:
            return True
        LOG.warning(
            "not doing %s of guest %s: keel-api withdrew request %s (it answered 503)",
            what,
            instance_uuid,
            ctx.request_id,
            extra=_extra(instance_uuid),
        )
        return False

    async def _power(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        action: PowerAction,
        operation: Callable[[UUID], Awaitable[None]],
        *,
        starts: bool = False,
    ) -> None:
        """Run a power operation on the guest and tell the conductor how it went."""
        slot = self._may_start if starts else self.operations.hold
        async with slot(instance_uuid, action.value):
            if not await self._taken(ctx, instance_uuid, action.value):
                return
            try:
                await operation(instance_uuid)
            except KeelError as exc:
                message = exc.message
                LOG.warning("%s of guest %s failed: %s", action, instance_uuid, message)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                LOG.exception("%s of guest %s failed unexpectedly", action, instance_uuid)
            else:
                LOG.info("%s of guest %s done", action, instance_uuid, extra=_extra(instance_uuid))
                await self._conductor.instance_action_result(
                    ctx, instance_uuid, action, success=True
                )
                return
            await self._conductor.instance_action_result(
                ctx, instance_uuid, action, success=False, message=message
            )

    async def rebuild_instance(self, ctx: RequestContext, req: RebuildInstance) -> None:
        """Build a moved instance here and tell the conductor how it went.

        The instance was evacuated or migrated here; the record ``req.migration_uuid``
        says which, and the conductor finishes the move from this result.
        """
        spec = req.instance
        if req.in_place:
            await self._resize_in_place(ctx, req)
            return
        async with self._may_start(spec.uuid, "rebuild"):
            existed = spec.uuid in await self._driver.list_instances()
            message: str | None = None
            if existed:
                foreign = await self._foreign_copy(spec)
                if foreign is not None:
                    await self._conductor.move_result(
                        ctx, req.migration_uuid, success=False, message=foreign
                    )
                    return
                LOG.info(
                    "guest %s already exists here: the rebuild was repeated",
                    spec.uuid,
                    extra=_extra(spec.uuid),
                )
            else:
                if not await self._move_waits(ctx, req, "before building"):
                    return
                try:
                    await self._driver.rebuild(spec, source_disk=req.source_disk)
                    if req.powered_off:
                        await self._driver.power_off(spec.uuid)
                    self._faults.reached("compute.rebuild.after_spawn")
                except KeelError as exc:
                    message = exc.message
                except Exception as exc:
                    message = f"{type(exc).__name__}: {exc}"
                    LOG.exception("rebuild of %s failed unexpectedly", spec.uuid)
                if message is None and not await self._move_waits(ctx, req, "after building"):
                    await self._discard(spec.uuid, "its move ended while the copy was built")
                    return
            if message is not None:
                LOG.warning(
                    "rebuild of guest %s for move %s failed: %s",
                    spec.uuid,
                    req.migration_uuid,
                    message,
                    extra=_extra(spec.uuid),
                )
                await self._discard(spec.uuid, "its rebuild failed")
                await self._conductor.move_result(
                    ctx, req.migration_uuid, success=False, message=message
                )
                return
            LOG.info(
                "guest %s rebuilt here for move %s",
                spec.uuid,
                req.migration_uuid,
                extra=_extra(spec.uuid),
            )
            await self._conductor.move_result(ctx, req.migration_uuid, success=True)

    async def _move_waits(self, ctx: RequestContext, req: RebuildInstance, when: str) -> bool:
        """Whether the move still waits for its copy here (a conductor too old to say: yes).

        A rebuild may be delivered late, after the move deadline ended the move and the
        source's copy was started again: building then would make a second running copy.
        """
        check = await self._conductor.check_move(ctx, req.migration_uuid, self._node_uuid)
        if check is None or check.verdict is BuildVerdict.BUILD:
            return True
        LOG.info(
            "not building guest %s for move %s (checked %s): %s",
            req.instance.uuid,
            req.migration_uuid,
            when,
            check.reason,
            extra={**_extra(req.instance.uuid), "decision": f"move_{check.verdict.value}"},
        )
        return False

    async def _resize_in_place(self, ctx: RequestContext, req: RebuildInstance) -> None:
        """A resize on this, the guest's own, host: the existing guest (shut down for the
        move) takes the new flavor, keeping its data and origin, and starts again if it ran.

        Repeated, it applies the same flavor again. Nothing here ever removes the guest.
        """
        spec = req.instance
        async with self._may_start(spec.uuid, "resize"):
            try:
                await self._driver.resize(spec.uuid, spec.flavor)
                if not req.powered_off:
                    await self._driver.power_on(spec.uuid)
            except KeelError as exc:
                message: str | None = exc.message
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                LOG.exception("resize of %s in place failed unexpectedly", spec.uuid)
            else:
                message = None
        if message is not None:
            LOG.warning(
                "resize of guest %s in place for move %s failed: %s; the guest is kept",
                spec.uuid,
                req.migration_uuid,
                message,
                extra=_extra(spec.uuid),
            )
            await self._conductor.move_result(
                ctx, req.migration_uuid, success=False, message=message
            )
            return
        LOG.info(
            "guest %s resized in place to flavor %s for move %s",
            spec.uuid,
            spec.flavor.name,
            req.migration_uuid,
            extra=_extra(spec.uuid),
        )
        await self._conductor.move_result(ctx, req.migration_uuid, success=True)

    async def _foreign_copy(self, spec: InstanceSpec) -> str | None:
        """Why the guest already here is not the one this move made; ``None`` if it is.

        A copy another move or the first build left here (stale data) is never adopted:
        it is shut down and kept for an operator, and the move fails.
        """
        if spec.origin is None:
            return None
        found = await self._driver.origin(spec.uuid)
        if found == spec.origin:
            return None
        await self._driver.power_off(spec.uuid)
        made_by = "its first build" if found is None else f"move {found}"
        reason = (
            f"a copy of server {spec.uuid} made by {made_by} is already on this host; it is "
            f"not adopted for move {spec.origin}: it is kept, shut down, for an operator "
            "(keel-manage compute orphans)"
        )
        LOG.warning(
            "not rebuilding guest %s: %s",
            spec.uuid,
            reason,
            extra={**_extra(spec.uuid), "decision": "guest_not_adopted"},
        )
        return reason

    async def prepare_migration(
        self, ctx: RequestContext, req: PrepareMigration
    ) -> PreparedMigration:
        """Shut the source guest down before its copy is built elsewhere; keep its data.

        Repeated, it finds the guest already shut down and answers the same disk. Until
        the migration is confirmed this copy is what a revert returns to, so nothing here
        removes it. The answer says where the disk is, for the destination to copy.
        """
        async with self.operations.hold(req.instance_uuid, "prepare migration"):
            await self._driver.power_off(req.instance_uuid)
            disk = await self._driver.migration_disk(req.instance_uuid)
        LOG.info(
            "guest %s is shut down for migration %s; its data stays here until the "
            "migration is confirmed",
            req.instance_uuid,
            req.migration_uuid,
            extra=_extra(req.instance_uuid),
        )
        return PreparedMigration(disk=disk)

    async def remove_moved_guest(self, ctx: RequestContext, req: RemoveMovedGuest) -> None:
        """Remove the copy a confirmed (source) or reverted (destination) migration left."""
        async with self.operations.hold(req.instance_uuid, "remove moved guest"):
            if req.instance_uuid not in await self._driver.list_instances():
                discard = getattr(self._driver, "discard_incoming", None)
                if discard is not None:
                    # A live migration that ended before its guest arrived: the files
                    # its prepare made go (only this migration's).
                    await discard(req.instance_uuid, req.migration_uuid)
                LOG.info(
                    "guest %s is already gone from this host (migration %s)",
                    req.instance_uuid,
                    req.migration_uuid,
                    extra=_extra(req.instance_uuid),
                )
                return
            if req.only_origin is not None:
                found = await self._driver.origin(req.instance_uuid)
                if found != req.only_origin:
                    LOG.warning(
                        "keeping guest %s: migration %s asked to remove the copy it made, "
                        "but this one was made by %s",
                        req.instance_uuid,
                        req.migration_uuid,
                        "the first build" if found is None else f"move {found}",
                        extra={**_extra(req.instance_uuid), "decision": "guest_kept"},
                    )
                    return
            await self._driver.destroy(req.instance_uuid)
        LOG.warning(
            "removed guest %s: migration %s made this copy redundant",
            req.instance_uuid,
            req.migration_uuid,
            extra={**_extra(req.instance_uuid), "decision": "guest_removed"},
        )

    async def finish_revert(self, ctx: RequestContext, req: FinishRevert) -> None:
        """The instance is this (source) guest again: start it if it was running."""
        async with self._may_start(req.instance_uuid, "finish revert"):
            if req.flavor is not None:
                # A resize on this host is reverted: the guest gets its old size back.
                await self._driver.resize(req.instance_uuid, req.flavor)
            if req.power_on:
                await self._driver.power_on(req.instance_uuid)
            elif req.instance_uuid not in await self._driver.list_instances():
                raise GuestNotFound(
                    f"guest {req.instance_uuid} is not on this host any more: migration "
                    f"{req.migration_uuid} cannot be reverted to it"
                )
        LOG.info(
            "migration %s is reverted: guest %s is the instance again%s",
            req.migration_uuid,
            req.instance_uuid,
            " and is running" if req.power_on else " (left shut down, as it was)",
            extra=_extra(req.instance_uuid),
        )

    async def get_instance_diagnostics(
        self, ctx: RequestContext, req: GetInstanceDiagnostics
    ) -> GuestDiagnostics:
        """What the driver knows of the guest, read-only (no guest slot is taken)."""
        return await self._driver.diagnostics(req.instance_uuid)

    async def get_console_output(self, ctx: RequestContext, req: GetConsoleOutput) -> ConsoleOutput:
        """The end of the guest's console log, read-only (no guest slot is taken).

        A reboot waiting for its guest to shut down must not delay a look at the console,
        and reading twice at once is harmless.
        """
        log = await self._driver.console_output(req.instance_uuid)
        text = tail_lines(log, req.tail_length).decode("ascii", errors="replace")
        return ConsoleOutput(output=text)
