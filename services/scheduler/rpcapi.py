"""The client of keel-scheduler: the only way other services talk to it.

Scheduler RPC API history:

* 1.0 — select_destinations (call): filter, weigh and claim; returns the claimed host.
* 1.1 — select_destinations claims for ``spec.consumer_uuid`` when it is set (a move's
  migration) and avoids ``spec.ignore_nodes``; sent at 1.0 only without them.
* 1.2 — select_destinations honours ``spec.requested_destination``: candidates narrowed
  to its compute nodes (every filter still runs), or, when forced, the filters skipped
  (the claim is still atomic). Sent at 1.2 only with a destination.
* 1.3 — select_destinations honours the server group of ``spec.instance_uuid``: its hard
  policy filters the hosts and its soft policy weighs them, read by the scheduler under
  the group's lock in the transaction that claims. ``spec.group`` is what the scheduler
  reads; senders leave it unset, so nothing new is sent and requests go out as before.
"""

from __future__ import annotations

from uuid import UUID

from shared.context import RequestContext
from shared.exceptions import ServiceTooOld
from shared.objects.base import KeelModel
from shared.objects.instance import RequestSpec
from shared.rpc.client import CapSource, RPCClient
from shared.rpc.transport import Transport
from shared.versions import SERVICE_VERSION, apis_for

TOPIC = "scheduler"
RPC_VERSION = apis_for(SERVICE_VERSION).scheduler
#: The scheduler RPC version that honours a requested destination.
DESTINATION_VERSION = "1.2"
#: The scheduler RPC version that honours server groups.
SERVER_GROUP_VERSION = "1.3"


class SelectDestinations(KeelModel):
    spec: RequestSpec


class Selection(KeelModel):
    """A host chosen for an instance, whose resources are already claimed for it."""

    service_uuid: UUID
    compute_node_id: int
    compute_node_uuid: UUID
    host: str
    nodename: str


class SchedulerAPI:
    def __init__(
        self,
        transport: Transport,
        *,
        version_cap: str | CapSource = RPC_VERSION,
        timeout: float = 60.0,
    ) -> None:
        self.client = RPCClient(transport, TOPIC, version_cap=version_cap, timeout=timeout)

    async def select_destinations(self, ctx: RequestContext, spec: RequestSpec) -> Selection:
        """Raises NoValidHost when no host passes the filters with room to claim.

        A request for a move (a consumer other than the instance) needs a scheduler that
        honours it: an older one would hand back the instance's own claim on its source.
        A requested destination needs 1.2: an older scheduler would silently drop it, so
        ServiceTooOld is raised instead.
        """
        if spec.requested_destination is not None:
            if not await self.can_take_destinations():
                raise ServiceTooOld(
                    "the scheduler is too old to honour a requested destination (scheduler "
                    f"RPC {await self.client.cap()}, a destination needs "
                    f"{DESTINATION_VERSION}); upgrade keel-scheduler"
                )
            return await self._select(ctx, spec, DESTINATION_VERSION)
        version = "1.1"
        if not await self.client.can_send_version(version):
            if spec.consumer_uuid is not None or spec.ignore_nodes:
                raise ServiceTooOld(
                    "the scheduler is too old to place a move (scheduler RPC "
                    f"{await self.client.cap()}, a move needs 1.1); upgrade keel-scheduler"
                )
            version = "1.0"
        return await self._select(ctx, spec, version)

    async def can_take_destinations(self) -> bool:
        """Whether the scheduler cap allows a requested destination (1.2)."""
        return await self.client.can_send_version(DESTINATION_VERSION)

    async def _select(self, ctx: RequestContext, spec: RequestSpec, version: str) -> Selection:
        return await self.client.call(
            ctx,
            "select_destinations",
            SelectDestinations(spec=spec),
            version=version,
            returns=Selection,
        )
