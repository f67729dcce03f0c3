"""What an agent does with the guests it finds on its host, as the database decides.

At start-up — after its identity is resolved, before it consumes its queue or reports
up — and then every ``KEEL_COMPUTE__RECONCILE_INTERVAL`` seconds (so a host that was only
cut off learns too), the agent reports its guests to the conductor and acts on the
answer:

* an evacuation away from this host recorded ``done``: the instance was rebuilt
  elsewhere, so the local copy is removed (if there is one) and the evacuation
  confirmed — the record becomes ``completed`` and this host's claim is released;
* an evacuation still ``accepted`` or ``pre-migrating``: the guest is kept and shut
  down (the host may only have been cut off: its copy must not run beside the one being
  rebuilt); once the record says ``done`` it is removed, and if it ends ``error`` or
  ``failed`` the local copy is the only one and stays;
* the instance was deleted while the agent was away: the guest is removed;
* a cold migration away from here was confirmed, or one to here reverted: this copy
  is redundant; it is removed and the conductor told (``copy_removed``), which finishes
  the confirm or revert if it could not while this agent was away;
* nothing explains the guest (its instance is placed elsewhere with no move from or to
  here, or unknown, or a failed move left it): it is never destroyed; it is shut down,
  logged and recorded as orphaned (``keel-manage compute orphans``).

What decides each fate is :mod:`services.conductor.guests.verdicts` (its table).

Every guest removed is logged with the record that authorised it. A guest is never
removed because a host field looks different.
"""

from __future__ import annotations

import logging
from uuid import UUID

from services.compute.manager import ComputeManager
from services.compute.virt.driver import Driver
from services.conductor.rpcapi import ConductorAPI, GuestFate, GuestVerdict
from shared.context import RequestContext
from shared.exceptions import GuestNotFound
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)


class GuestReconciler:
    def __init__(
        self, driver: Driver, conductor: ConductorAPI, manager: ComputeManager, node_uuid: UUID
    ) -> None:
        self._driver = driver
        self._conductor = conductor
        self._manager = manager
        self._node_uuid = node_uuid
        #: Guests already reported as orphaned or waiting, so each is logged once.
        self._told: dict[UUID, GuestFate] = {}

    async def reconcile(self) -> None:
        ctx = RequestContext.internal()
        guests = await self._driver.list_instances()
        power: dict[UUID, PowerState] = {}
        tokens: dict[UUID, UUID | None] = {}
        for guest in guests:
            try:
                power[guest] = await self._driver.guest_power(guest)
                tokens[guest] = await self._driver.origin(guest)
            except GuestNotFound:
                continue
        report = await self._conductor.report_guests(ctx, self._node_uuid, guests, power, tokens)
        if report is None:
            LOG.info("the conductor is too old to say what becomes of guests; leaving them be")
            return
        for verdict in report.verdicts:
            await self._apply(verdict)
            if verdict.fate is GuestFate.MOVED:
                assert verdict.migration_uuid is not None
                await self._conductor.copy_removed(ctx, verdict.migration_uuid, self._node_uuid)
        for verdict in report.to_confirm:
            assert verdict.migration_uuid is not None
            await self._remove(verdict.instance_uuid, verdict.reason)
            await self._conductor.evacuation_confirmed(ctx, verdict.migration_uuid, self._node_uuid)

    async def _remove(self, instance_uuid: UUID, why: str) -> None:
        """Destroy a guest the database says must go (one operation per guest at a time)."""
        async with self._manager.operations.hold(instance_uuid, "remove"):
            if instance_uuid in await self._driver.list_instances():
                await self._driver.destroy(instance_uuid)
                LOG.warning(
                    "removed guest %s: %s",
                    instance_uuid,
                    why,
                    extra={"instance_uuid": str(instance_uuid), "decision": "guest_removed"},
                )

    async def _shut_down(self, instance_uuid: UUID) -> None:
        """Power off a guest that must not run here (kept, never destroyed)."""
        async with self._manager.operations.hold(instance_uuid, "shut down"):
            try:
                await self._driver.power_off(instance_uuid)
            except GuestNotFound:
                return

    async def _apply(self, verdict: GuestVerdict) -> None:
        guest = verdict.instance_uuid
        extra = {"instance_uuid": str(guest)}
        if verdict.fate is GuestFate.DELETED:
            await self._remove(guest, "its instance was deleted")
        elif verdict.fate in (GuestFate.EVACUATED, GuestFate.MOVED):
            await self._remove(guest, verdict.reason)
        elif verdict.fate in (GuestFate.EVACUATING, GuestFate.ORPHANED):
            await self._shut_down(guest)
            if self._told.get(guest) is not verdict.fate:
                level = logging.WARNING if verdict.fate is GuestFate.ORPHANED else logging.INFO
                LOG.log(
                    level,
                    "keeping guest %s and not starting it: %s",
                    guest,
                    f"orphaned ({verdict.reason})"
                    if verdict.fate is GuestFate.ORPHANED
                    else verdict.reason,
                    extra={**extra, "decision": f"guest_{verdict.fate.value}"},
                )
            self._told[guest] = verdict.fate
        else:
            self._told.pop(guest, None)
