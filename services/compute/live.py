"""The agent's side of live migration (compute RPC 1.16; see :mod:`services.compute.live_rpc`).

**Never two running copies.** The destination builds no copy before the switch-over:
``prepare_live_migration`` only checks. The source copies the guest's memory while it
runs (the ``local`` and ``fake`` drivers simulate the copy: progress over
``KEEL_COMPUTE__LIVE_MIGRATION_SECONDS``), then *pauses* its guest and only then asks
the conductor to switch over; the conductor records ``post-migrating`` and only then has
the destination start its copy (``start_live_copy``), carrying the move's copy token.
The source removes its copy once the conductor answers that the server lives on the
destination, and resumes it only when the answer says the migration ended without a
switch-over (aborted, failed, timed out), when no destination copy was ever started or
the one started was removed first.

Every handler is safe twice at once: they hold the guest's operation slot, and each
repeat asks the conductor, whose compare-and-swaps on the record decide, so a repeated
``live_migrate`` whose migration has ended only resumes a guest it left paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING
from uuid import UUID

from services.compute.inflight import InFlight
from services.compute.live_rpc import (
    LiveMigrate,
    LivePrepared,
    LiveTarget,
    PrepareLiveMigration,
    RollbackLiveMigration,
    StartLiveCopy,
)
from services.compute.virt.driver import Driver
from services.conductor.live_rpc import LiveAction, SwitchOutcome
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.exceptions import GuestNotFound, KeelError
from shared.objects.states import PowerState

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

LOG = logging.getLogger(__name__)

MIB = 1024 * 1024
GIB = 1024 * MIB


def _extra(instance_uuid: UUID, migration_uuid: UUID) -> dict[str, str]:
    return {"instance_uuid": str(instance_uuid), "migration_uuid": str(migration_uuid)}


class LiveMigrationRefused(KeelError):
    """This host's driver cannot move a running guest."""


def refusal(driver: Driver) -> str | None:
    """Why ``driver`` cannot live-migrate (its ``live_migration_refusal``); ``None``: it can."""
    reason = getattr(driver, "live_migration_refusal", None)
    return reason if isinstance(reason, str) else None


class LiveMigrationHandlers:
    """Mixed into :class:`~services.compute.manager.ComputeManager`."""

    _driver: Driver
    _conductor: ConductorAPI
    _node_uuid: UUID
    operations: InFlight
    #: How long the simulated memory copy takes, and how often it reports progress.
    live_migration_seconds: float = 2.0

    if TYPE_CHECKING:

        def _may_start(
            self, instance_uuid: UUID, operation: str
        ) -> AbstractAsyncContextManager[None]: ...

    async def prepare_live_migration(
        self, ctx: RequestContext, req: PrepareLiveMigration
    ) -> LivePrepared:
        """Check that this (destination) host can take the copy. A driver that moves
        guests itself (libvirt) prepares the guest's files and answers its target; the
        others build nothing yet."""
        spec = req.instance
        why = refusal(self._driver)
        if why is not None:
            raise LiveMigrationRefused(why)
        async with self.operations.hold(spec.uuid, "prepare live migration"):
            if spec.uuid in await self._driver.list_instances():
                found = await self._driver.origin(spec.uuid)
                if found != req.migration_uuid:
                    made_by = "its first build" if found is None else f"move {found}"
                    raise KeelError(
                        f"a copy of server {spec.uuid} made by {made_by} is already on this "
                        f"host; live migration {req.migration_uuid} does not adopt it"
                    )
            target = None
            prepare = getattr(self._driver, "prepare_incoming", None)
            if prepare is not None:
                target = await prepare(spec, req.migration_uuid)
        LOG.info(
            "ready to take server %s for live migration %s%s",
            spec.uuid,
            req.migration_uuid,
            "" if target is None else f" (its driver receives it from {target.uri})",
            extra=_extra(spec.uuid, req.migration_uuid),
        )
        return LivePrepared(target=target)

    async def live_migrate(self, ctx: RequestContext, req: LiveMigrate) -> None:
        """Copy the guest (simulated), pause it, switch over; then remove or resume it."""
        extra = _extra(req.instance_uuid, req.migration_uuid)
        async with self.operations.hold(req.instance_uuid, "live migration"):
            if req.target is not None:
                await self._migrate_by_driver(ctx, req, req.target, extra)
                return
            go = await self._copy_memory(ctx, req)
            if not go:
                await self._resume_if_left_paused(req.instance_uuid, req.paused, extra)
                return
            if req.instance_uuid not in await self._driver.list_instances():
                # A repeat after this copy was removed for the completed migration.
                LOG.info(
                    "guest %s is not on this host: nothing to switch over for live migration %s",
                    req.instance_uuid,
                    req.migration_uuid,
                    extra=extra,
                )
                return
            if not req.paused:
                await self._driver.pause(req.instance_uuid)
            LOG.info(
                "guest %s is paused for the switch-over of live migration %s",
                req.instance_uuid,
                req.migration_uuid,
                extra={**extra, "decision": "live_migration_paused"},
            )
            answer = await self._conductor.live.live_migration_switch(
                ctx, req.migration_uuid, self._node_uuid
            )
            if answer.outcome is SwitchOutcome.COMPLETED:
                await self._remove_source(req, extra)
            elif answer.outcome is SwitchOutcome.RESUME:
                LOG.warning(
                    "live migration %s of guest %s ended without switching over (%s): "
                    "resuming it here",
                    req.migration_uuid,
                    req.instance_uuid,
                    answer.reason,
                    extra={**extra, "decision": "live_migration_resumed"},
                )
                await self._resume_if_left_paused(req.instance_uuid, req.paused, extra)
            else:
                LOG.info(
                    "live migration %s of guest %s: %s",
                    req.migration_uuid,
                    req.instance_uuid,
                    answer.reason,
                    extra=extra,
                )

    async def _migrate_by_driver(
        self, ctx: RequestContext, req: LiveMigrate, target: LiveTarget, extra: dict[str, str]
    ) -> None:
        """The driver moves the guest (libvirt); then the switch-over.

        The guest runs here until the driver's copy is done; then this domain is shut off
        and the destination's is paused, and the conductor's switch-over resumes it there
        (``start_live_copy``). A copy that failed or was aborted left the guest running
        here: the switch-over is asked all the same, so that the destination, finding no
        guest arrived, removes what it prepared and the migration ends ``failed`` (or, if
        it ended already, the destination's leftovers are removed) — the answer then says
        resume, which leaves this guest as it is.
        """
        migrate = getattr(self._driver, "migrate_live", None)
        if migrate is None or getattr(self._driver, "driver_name", None) != target.driver:
            raise LiveMigrationRefused(
                f"this host's driver cannot move a guest to a {target.driver} destination"
            )
        if req.instance_uuid not in await self._driver.list_instances():
            LOG.info(
                "guest %s is not on this host: nothing to move for live migration %s",
                req.instance_uuid,
                req.migration_uuid,
                extra=extra,
            )
            return
        moved = False
        power = await self._driver.guest_power(req.instance_uuid)
        if power not in (PowerState.RUNNING, PowerState.PAUSED):
            # A repeat: an earlier delivery's copy is done, this domain is shut off.
            moved = True
        else:
            told: list[str] = []

            async def report(memory: tuple[int, int], disk: tuple[int, int]) -> bool:
                try:
                    directive = await self._conductor.live.live_migration_progress(
                        ctx, req.migration_uuid, self._node_uuid, memory=memory, disk=disk
                    )
                except KeelError as exc:
                    LOG.warning("live migration %s: progress not reported: %s",
                                req.migration_uuid, exc.message, extra=extra)  # fmt: skip
                    return True
                if directive.action is LiveAction.ABORT:
                    if not told:
                        told.append(directive.reason)
                        LOG.warning(
                            "live migration %s of guest %s is aborted: %s",
                            req.migration_uuid,
                            req.instance_uuid,
                            directive.reason,
                            extra=extra,
                        )
                    return False
                return True

            if await report((req.memory_mb * MIB, 0), (req.disk_gb * GIB, 0)):
                try:
                    await migrate(req.instance_uuid, target, report)
                    moved = True
                except KeelError as exc:
                    LOG.warning(
                        "live migration %s: %s; the guest runs on here",
                        req.migration_uuid,
                        exc.message,
                        extra={**extra, "decision": "live_migration_copy_failed"},
                    )
        answer = await self._conductor.live.live_migration_switch(
            ctx, req.migration_uuid, self._node_uuid
        )
        if answer.outcome is SwitchOutcome.COMPLETED and moved:
            await self._remove_source(req, extra)
        elif answer.outcome is SwitchOutcome.RESUME and moved:
            LOG.error(
                "live migration %s ended without switching over (%s) after libvirt moved "
                "guest %s: it is paused on the destination, not here",
                req.migration_uuid,
                answer.reason,
                req.instance_uuid,
                extra={**extra, "decision": "live_migration_stranded"},
            )
        else:
            LOG.info(
                "live migration %s of guest %s: %s (%s)",
                req.migration_uuid,
                req.instance_uuid,
                answer.outcome,
                answer.reason,
                extra=extra,
            )

    async def _remove_source(self, req: LiveMigrate, extra: dict[str, str]) -> None:
        """The switch-over completed: the server runs on its destination, this copy goes."""
        with contextlib.suppress(GuestNotFound):
            await self._driver.destroy(req.instance_uuid)
        LOG.info(
            "removed guest %s: live migration %s completed, the server runs on its destination",
            req.instance_uuid,
            req.migration_uuid,
            extra={**extra, "decision": "live_migration_source_removed"},
        )

    async def _copy_memory(self, ctx: RequestContext, req: LiveMigrate) -> bool:
        """The simulated copy, reporting progress; False if the conductor says abort."""
        memory = req.memory_mb * MIB
        disk = req.disk_gb * GIB
        seconds = max(self.live_migration_seconds, 0.0)
        steps = max(1, round(seconds / 0.25))
        for step in range(steps + 1):
            done = step / steps
            directive = await self._conductor.live.live_migration_progress(
                ctx,
                req.migration_uuid,
                self._node_uuid,
                memory=(memory, int(memory * done)),
                disk=(disk, int(disk * done)),
            )
            if directive.action is LiveAction.ABORT:
                LOG.warning(
                    "live migration %s of guest %s stops copying: %s",
                    req.migration_uuid,
                    req.instance_uuid,
                    directive.reason,
                    extra=_extra(req.instance_uuid, req.migration_uuid),
                )
                return False
            if directive.action is LiveAction.COMPLETE or step == steps:
                return True
            await asyncio.sleep(seconds / steps)
        return True

    async def _resume_if_left_paused(
        self, instance_uuid: UUID, server_paused: bool, extra: dict[str, str]
    ) -> None:
        if server_paused:
            return
        try:
            power = await self._driver.guest_power(instance_uuid)
            if power == PowerState.PAUSED:
                await self._driver.unpause(instance_uuid)
                LOG.info("guest %s resumed on its source", instance_uuid, extra=extra)
        except GuestNotFound:
            LOG.info("guest %s is gone from this host: nothing to resume", instance_uuid)

    async def start_live_copy(self, ctx: RequestContext, req: StartLiveCopy) -> None:
        """Start the server's copy here; a repeat finds the copy this move made."""
        spec = req.instance
        extra = _extra(spec.uuid, req.migration_uuid)
        receives = hasattr(self._driver, "discard_incoming")
        async with self._may_start(spec.uuid, "live migration switch-over"):
            if spec.uuid in await self._driver.list_instances():
                found = await self._driver.origin(spec.uuid)
                if found != req.migration_uuid:
                    raise KeelError(
                        f"a copy of server {spec.uuid} that live migration "
                        f"{req.migration_uuid} did not make is on this host; not adopted"
                    )
                if receives:
                    # The guest libvirt moved here, paused: it is the server now.
                    if not req.paused:
                        await self._driver.unpause(spec.uuid)
                    await self._driver.arrived(spec.uuid)  # type: ignore[attr-defined]
                else:
                    LOG.info("guest %s is already here: the switch-over was repeated", spec.uuid)
            elif receives:
                await self._driver.discard_incoming(  # type: ignore[attr-defined]
                    spec.uuid, req.migration_uuid
                )
                raise KeelError(
                    f"no guest arrived for live migration {req.migration_uuid}: the copy "
                    "did not complete (its prepared files are removed)"
                )
            else:
                try:
                    await self._driver.rebuild(spec)
                except Exception as exc:
                    try:
                        await self._driver.destroy(spec.uuid)
                    except Exception:
                        LOG.exception("could not remove the failed copy of %s", spec.uuid)
                    message = exc.message if isinstance(exc, KeelError) else repr(exc)
                    raise KeelError(
                        f"the destination could not start its copy: {message}"
                    ) from None
            if req.paused:
                await self._driver.pause(spec.uuid)
        LOG.info(
            "guest %s runs here for live migration %s%s",
            spec.uuid,
            req.migration_uuid,
            " (paused, as the server is)" if req.paused else "",
            extra={**extra, "decision": "live_migration_destination_started"},
        )

    async def rollback_live_migration(
        self, ctx: RequestContext, req: RollbackLiveMigration
    ) -> None:
        """The migration ended without switching over: resume a guest it left paused."""
        extra = _extra(req.instance_uuid, req.migration_uuid)
        async with self.operations.hold(req.instance_uuid, "live migration rollback"):
            await self._resume_if_left_paused(req.instance_uuid, not req.resume, extra)
