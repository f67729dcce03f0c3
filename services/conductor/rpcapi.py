"""The client of keel-conductor: the only way other services talk to it.

Conductor RPC API history:

* 1.0 — build_instances (cast), register_compute (call), service_heartbeat (call),
  instance_build_result (cast), instance_deleted (cast).
* 1.1 — check_build (call): whether a build an agent was sent is still wanted there.
* 1.2 — instance_action_result (cast): how a stop, start or reboot went on the agent.
* 1.3 — resolve_compute (call, read-only): what the database knows about an agent's host
  and node identity, asked before the agent creates an identity file or registers.
* 1.4 — evacuate_instance (cast, from keel-api), move_result (cast: how a rebuild went on
  the destination), report_guests (call: what the guests an agent finds on its host are
  to become), evacuation_confirmed (call: the source removed its copy).
* 1.5 — cold migration: migrate_instance, confirm_migration, revert_migration (casts,
  from keel-api), copy_removed (call: an agent removed the copy a confirmed or reverted
  migration left on its host); report_guests may answer ``moved``.
* 1.6 — build_instances may carry ``requested_destination``: the host and/or node an
  admin asked for, as compute node ids; sent at 1.6 only when it does.
* 1.7 — report_guests carries each guest's power state (``power``): the server's
  recorded state follows its host (a stop or start whose task was cleared, or a guest
  that stopped by itself).
* 1.8 — instance_action_result may report ``pause``, ``unpause``, ``suspend`` and
  ``resume`` (sent at 1.8 only for those).
* 1.9 — register_compute and service_heartbeat carry ``self_fence_after``: the seconds
  the agent goes without a successful heartbeat before it powers its guests off (0: it
  never does), recorded with its service; sent at 1.9 only when it is set.
* 1.10 — resize_instance (cast, from keel-api): a cold migration with a new flavor (its
  record carries both flavors: the destination is claimed and built with the new one,
  a revert restores the old one).
* 1.11 — take_request (call): an agent takes the request that sent it a stop, start,
  reboot, pause, unpause, suspend, resume or delete before acting on it; the answer is
  no if keel-api withdrew that request (it answered 503), and the agent does nothing.
* 1.12 — service_heartbeat carries ``fence_lease``: the lease of the host's fence while
  it is armed (absent: no armed fence), recorded with the service; a host counts as
  fenced by time only once that lease has run out. Copy tokens: check_build carries the
  token of the guest the agent already has (``guest``), instance_build_result the token
  of the guest it built (``built``), report_guests each guest's token (``tokens``); each
  is compared with the server's current copy's token.
* 1.13 — check_move (call): whether a move still waits for its copy on the asking
  destination, asked before the copy is built and again after (a rebuild delivered late,
  after the move deadline ended the move, builds nothing).
* 1.14 — instance_action_result may report ``rebuild`` (sent at 1.14 only for it);
  take_request may carry ``task`` and ``node_uuid``: take the request only while the
  task it began is still under way and the instance is on that node (a rebuild
  delivered again after it ended, or to a host the server has left, does nothing).
* 1.15 — instance_action_result may report ``soft_delete`` (the guest of a server deleted
  with soft delete on is off: the server is SOFT_DELETED) and ``restore`` (a restored
  server's guest runs again: ACTIVE); sent at 1.15 only for those.
* 1.16 — instance_action_result may report ``snapshot`` (the agent wrote the guest's
  disk into the image, or failed to: the server's snapshot task ends, a failed
  snapshot's image is killed); sent at 1.16 only for it.
* 1.17 — live migration: live_migrate_instance (cast, from keel-api),
  live_migration_progress and live_migration_switch (calls, from the source's agent);
  see :mod:`services.conductor.live_rpc`.
* 1.18 — shelve: unshelve_instance (cast, from keel-api): schedule a shelved and
  offloaded server again and build it from its shelved image; instance_action_result may
  report ``shelve``, ``shelve_offload`` and ``unshelve`` (sent at 1.18 only for those).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from services.conductor.live_rpc import LiveConductorAPI
from shared.context import RequestContext
from shared.exceptions import ServiceTooOld
from shared.objects.base import KeelModel
from shared.objects.compute_node import NodeResources
from shared.objects.instance import RequestedDestination
from shared.objects.states import PowerState
from shared.rpc.client import CapSource, RPCClient
from shared.rpc.transport import Transport
from shared.versions import SERVICE_VERSION, apis_for

TOPIC = "conductor"
#: The newest conductor RPC version this release speaks.
RPC_VERSION = apis_for(SERVICE_VERSION).conductor
#: The first conductor RPC version that carries out a resize.
RESIZE_VERSION = "1.10"


#: The first conductor RPC version that lets an agent take a request before acting.
TAKE_VERSION = "1.11"
#: How long an agent waits for ``take_request`` before it acts without an answer.
TAKE_TIMEOUT = 10.0

#: The conductor RPC version that carries a requested destination with a build.
DESTINATION_VERSION = "1.6"
#: The conductor RPC version whose registrations and heartbeats carry the agent's
#: self-fencing setting.
FENCING_VERSION = "1.9"
#: The conductor RPC version whose heartbeats carry the lease of the host's armed fence.
FENCE_LEASE_VERSION = "1.12"
#: The conductor RPC version whose build checks, build results and guest reports carry
#: copy tokens.
TOKEN_VERSION = "1.12"
#: check_move: a destination asks before and after it builds a move's copy.
CHECK_MOVE_VERSION = "1.13"
#: Shelve: unshelve_instance, and the results of a shelve, an offload and an unshelve.
SHELVE_VERSION = "1.18"


class BuildInstances(KeelModel):
    instance_uuid: UUID
    #: Where an admin asked the server to be placed (1.6); for this build only.
    requested_destination: RequestedDestination | None = None

    @model_serializer(mode="wrap")
    def _without_destination(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Leave out an unset destination, so a conductor of 1.5 or older reads the build."""
        data = handler(self)
        if isinstance(data, dict) and self.requested_destination is None:
            data.pop("requested_destination", None)
        return data


def _without_unset_fencing(data: Any, fence: float | None) -> Any:
    """Leave out an unset ``self_fence_after``, so a message reads as its older version."""
    if isinstance(data, dict) and fence is None:
        data.pop("self_fence_after", None)
    return data


class RegisterCompute(KeelModel):
    host: str = Field(min_length=1, max_length=255)
    node_uuid: UUID
    version: int = Field(ge=0)
    resources: NodeResources
    #: Seconds without a heartbeat before the agent fences itself; 0: never (1.9).
    self_fence_after: float | None = Field(default=None, ge=0, le=10**7)

    @model_serializer(mode="wrap")
    def _compat(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_unset_fencing(handler(self), self.self_fence_after)


class ResolveCompute(KeelModel):
    host: str = Field(min_length=1, max_length=255)
    #: The UUID in the agent's identity file; ``None`` when it has none.
    node_uuid: UUID | None = None
    hypervisor_hostname: str = Field(min_length=1, max_length=255)
    #: Where the agent keeps (or would keep) its identity file, for refusal messages.
    identity_file: str = Field(default="compute_id", max_length=4096)


class ComputeResolution(KeelModel):
    """The conductor's answer: which node UUID the agent is to register with.

    * ``known``: the node is on record for this host; go on with it.
    * ``new``: the database knows nothing of this host or node: a new compute node
      (with the presented UUID, or a fresh one the agent generates).
    * ``adopt``: the host was registered by a release that kept no identity file and has
      exactly one node: write ``node_uuid`` as the identity file.

    Every other case is a refusal, raised as an error.
    """

    decision: Literal["known", "new", "adopt"]
    node_uuid: UUID | None = None
    reason: str = ""


class Registration(KeelModel):
    """Who the agent is in the database: its routing key comes from ``service_uuid``."""

    service_uuid: UUID
    service_id: int
    node_uuid: UUID
    node_id: int


class ServiceHeartbeat(KeelModel):
    service_uuid: UUID
    version: int = Field(ge=0)
    node_uuid: UUID | None = None
    resources: NodeResources | None = None
    #: As in :class:`RegisterCompute` (1.9).
    self_fence_after: float | None = Field(default=None, ge=0, le=10**7)
    #: The lease of the host's fence, while it is armed (1.12).
    fence_lease: float | None = Field(default=None, gt=0, le=10**7)

    @model_serializer(mode="wrap")
    def _compat(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = _without_unset_fencing(handler(self), self.self_fence_after)
        if isinstance(data, dict) and self.fence_lease is None:
            data.pop("fence_lease", None)
        return data


class CopyToken(KeelModel):
    """The token a guest carries: of the build or move that made it (its origin;
    ``None``: a guest built before tokens)."""

    token: UUID | None = None


class InstanceBuildResult(KeelModel):
    instance_uuid: UUID
    success: bool
    message: str = ""
    #: The token of the guest built (1.12; absent from older agents).
    built: CopyToken | None = None


class InstanceDeleted(KeelModel):
    instance_uuid: UUID


class CheckBuild(KeelModel):
    instance_uuid: UUID
    #: The node of the agent asking.
    compute_node_uuid: UUID
    #: The token of the guest the agent already has for the instance (1.12); absent if
    #: it has none, or from an older agent.
    guest: CopyToken | None = None


class CheckMove(KeelModel):
    """Does move ``migration_uuid`` still wait for its copy on ``compute_node_uuid``?"""

    migration_uuid: UUID
    #: The node of the agent asking.
    compute_node_uuid: UUID


class BuildVerdict(StrEnum):
    #: The instance waits for this node to build it: build (or keep) the guest.
    BUILD = "build"
    #: The instance is past its build here, or lives elsewhere: touch nothing.
    LEAVE = "leave"
    #: Nobody wants this build any more (deleted, failed, timed out): remove the guest.
    ABANDON = "abandon"


class PowerAction(StrEnum):
    STOP = "stop"
    START = "start"
    REBOOT = "reboot"
    #: From conductor RPC 1.8.
    PAUSE = "pause"
    UNPAUSE = "unpause"
    SUSPEND = "suspend"
    RESUME = "resume"
    #: From conductor RPC 1.14.
    REBUILD = "rebuild"
    #: From conductor RPC 1.15.
    SOFT_DELETE = "soft_delete"
    RESTORE = "restore"
    #: From conductor RPC 1.16.
    SNAPSHOT = "snapshot"
    #: From conductor RPC 1.18.
    SHELVE = "shelve"
    SHELVE_OFFLOAD = "shelve_offload"
    UNSHELVE = "unshelve"


#: The conductor RPC version that takes each action's result.
ACTION_RESULT_SINCE: dict[PowerAction, str] = {
    **{action: "1.2" for action in (PowerAction.STOP, PowerAction.START, PowerAction.REBOOT)},
    **{
        action: "1.8"
        for action in (
            PowerAction.PAUSE,
            PowerAction.UNPAUSE,
            PowerAction.SUSPEND,
            PowerAction.RESUME,
        )
    },
    PowerAction.REBUILD: "1.14",
    PowerAction.SOFT_DELETE: "1.15",
    PowerAction.RESTORE: "1.15",
    PowerAction.SNAPSHOT: "1.16",
    **{
        action: SHELVE_VERSION
        for action in (PowerAction.SHELVE, PowerAction.SHELVE_OFFLOAD, PowerAction.UNSHELVE)
    },
}
#: The conductor RPC version whose take_request may name the task and node (1.14).
TAKE_CURRENT_VERSION = "1.14"


class InstanceActionResult(KeelModel):
    instance_uuid: UUID
    action: PowerAction
    success: bool
    message: str = ""


class BuildCheck(KeelModel):
    verdict: BuildVerdict
    #: Why, for the agent's log.
    reason: str = ""


class TakeRequest(KeelModel):
    """An agent takes keel-api's request ``request_id`` on the instance before acting."""

    instance_uuid: UUID
    request_id: str
    #: Take it only while the instance is in this task, on this node, and the request
    #: has not ended (1.14; sent only when set).
    task: str | None = None
    node_uuid: UUID | None = None

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.task is None:
            data.pop("task", None)
            data.pop("node_uuid", None)
        return data


class RequestTaken(KeelModel):
    #: False: keel-api withdrew the request; the agent must not act on it.
    proceed: bool


class UnshelveInstance(KeelModel):
    """Schedule shelved and offloaded server ``instance_uuid`` again and build it (1.18)."""

    instance_uuid: UUID
    #: Where an admin asked it to go (compute API 2.91 ``host``); this unshelve only.
    requested_destination: RequestedDestination | None = None


class EvacuateInstance(KeelModel):
    migration_uuid: UUID


class MoveResult(KeelModel):
    migration_uuid: UUID
    success: bool
    message: str = ""


class GuestFate(StrEnum):
    """What a guest an agent finds on its host is to become."""

    #: The instance lives here: keep the guest.
    KEEP = "keep"
    #: Evacuated and rebuilt elsewhere (the record says ``done``): remove the local copy.
    EVACUATED = "evacuated"
    #: An evacuation away from here has not ended: keep the guest, do not start it.
    EVACUATING = "evacuating"
    #: The instance was deleted: remove the guest.
    DELETED = "deleted"
    #: Nothing explains it: never destroyed; reported for an operator.
    ORPHANED = "orphaned"
    #: A migration confirmed (this was its source) or reverted (this was its
    #: destination) left this copy: remove it, then say so (``copy_removed``, 1.5).
    MOVED = "moved"


class GuestVerdict(KeelModel):
    instance_uuid: UUID
    fate: GuestFate
    #: The move that decides it, if one does.
    migration_uuid: UUID | None = None
    reason: str = ""


class ReportGuests(KeelModel):
    compute_node_uuid: UUID
    guests: list[UUID] = Field(default_factory=list, max_length=100_000)
    #: Each guest's power state as the hypervisor shows it (1.7).
    power: dict[UUID, PowerState] = Field(default_factory=dict, max_length=100_000)
    #: Each guest's copy token (1.12; ``None`` from an older agent).
    tokens: dict[UUID, UUID | None] | None = Field(default=None, max_length=100_000)


class GuestsReport(KeelModel):
    verdicts: list[GuestVerdict] = Field(default_factory=list)
    #: Evacuations away from this node that are ``done``, guest present or not: the
    #: agent removes the copy if it has one, then confirms each.
    to_confirm: list[GuestVerdict] = Field(default_factory=list)


class EvacuationConfirmed(KeelModel):
    migration_uuid: UUID
    compute_node_uuid: UUID


class MigrateInstance(KeelModel):
    migration_uuid: UUID


class ResizeInstance(KeelModel):
    migration_uuid: UUID


class ConfirmMigration(KeelModel):
    migration_uuid: UUID


class RevertMigration(KeelModel):
    migration_uuid: UUID


class CopyRemoved(KeelModel):
    """The agent of ``compute_node_uuid`` removed its copy for ``migration_uuid``."""

    migration_uuid: UUID
    compute_node_uuid: UUID


class ConductorAPI:
    def __init__(
        self,
        transport: Transport,
        *,
        version_cap: str | CapSource = RPC_VERSION,
        timeout: float = 60.0,
    ) -> None:
        self.client = RPCClient(transport, TOPIC, version_cap=version_cap, timeout=timeout)
        #: Live migration (1.17).
        self.live = LiveConductorAPI(self.client)

    async def can_take_destinations(self) -> bool:
        """Whether the conductor cap allows a build with a requested destination (1.6)."""
        return await self.client.can_send_version(DESTINATION_VERSION)

    async def build_instances(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        requested_destination: RequestedDestination | None = None,
    ) -> None:
        """Cast a build. A requested destination needs 1.6: with an older cap this raises
        ServiceTooOld rather than send a build that would silently drop it."""
        version = "1.0"
        if requested_destination is not None:
            if not await self.can_take_destinations():
                raise ServiceTooOld(
                    "keel-conductor is too old to honour a requested destination (conductor "
                    f"RPC {await self.client.cap()}, a destination needs "
                    f"{DESTINATION_VERSION}); upgrade keel-conductor"
                )
            version = DESTINATION_VERSION
        req = BuildInstances(
            instance_uuid=instance_uuid, requested_destination=requested_destination
        )
        await self.client.cast(ctx, "build_instances", req, version=version)

    async def register_compute(
        self,
        ctx: RequestContext,
        *,
        host: str,
        node_uuid: UUID,
        version: int,
        resources: NodeResources,
        self_fence_after: float | None = None,
    ) -> Registration:
        """Register an agent; its self-fencing setting travels only where 1.9 may be sent."""
        fence, at = await self._fencing(self_fence_after)
        req = RegisterCompute(
            host=host,
            node_uuid=node_uuid,
            version=version,
            resources=resources,
            self_fence_after=fence,
        )
        return await self.client.call(
            ctx, "register_compute", req, version=at, returns=Registration
        )

    async def _fencing(self, self_fence_after: float | None) -> tuple[float | None, str]:
        """The setting to send and the version to send it at (1.0 without it)."""
        if self_fence_after is None or not await self.client.can_send_version(FENCING_VERSION):
            return None, "1.0"
        return self_fence_after, FENCING_VERSION

    async def resolve_compute(
        self,
        ctx: RequestContext,
        *,
        host: str,
        node_uuid: UUID | None,
        hypervisor_hostname: str,
        identity_file: str,
    ) -> ComputeResolution | None:
        """What the database knows of this host; ``None`` if the conductor cannot say."""
        if not await self.client.can_send_version("1.3"):
            return None
        req = ResolveCompute(
            host=host,
            node_uuid=node_uuid,
            hypervisor_hostname=hypervisor_hostname,
            identity_file=identity_file,
        )
        return await self.client.call(
            ctx, "resolve_compute", req, version="1.3", returns=ComputeResolution, idempotent=True
        )

    async def service_heartbeat(
        self,
        ctx: RequestContext,
        *,
        service_uuid: UUID,
        version: int,
        node_uuid: UUID | None = None,
        resources: NodeResources | None = None,
        self_fence_after: float | None = None,
        fence_lease: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Say the agent lives; with the lease of its host's fence where 1.12 may be sent."""
        fence, at = await self._fencing(self_fence_after)
        if await self.client.can_send_version(FENCE_LEASE_VERSION):
            at = FENCE_LEASE_VERSION
        else:
            fence_lease = None
        req = ServiceHeartbeat(
            service_uuid=service_uuid,
            version=version,
            node_uuid=node_uuid,
            resources=resources,
            self_fence_after=fence,
            fence_lease=fence_lease,
        )
        await self.client.call(
            ctx, "service_heartbeat", req, version=at, timeout=timeout, idempotent=True
        )

    async def instance_build_result(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        *,
        success: bool,
        message: str = "",
        built: CopyToken | None = None,
    ) -> None:
        """How a build went; with the built guest's token where 1.12 may be sent."""
        version = TOKEN_VERSION if await self.client.can_send_version(TOKEN_VERSION) else "1.0"
        req = InstanceBuildResult(
            instance_uuid=instance_uuid,
            success=success,
            message=message,
            built=built if version == TOKEN_VERSION else None,
        )
        await self.client.cast(ctx, "instance_build_result", req, version=version)

    async def check_build(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        compute_node_uuid: UUID,
        guest: CopyToken | None = None,
    ) -> BuildCheck | None:
        """Whether the build is still wanted; ``None`` if the conductor is too old to say.
        ``guest``: the token of the guest already here, if any (sent where 1.12 may be)."""
        if not await self.client.can_send_version("1.1"):
            return None
        version = TOKEN_VERSION if await self.client.can_send_version(TOKEN_VERSION) else "1.1"
        req = CheckBuild(
            instance_uuid=instance_uuid,
            compute_node_uuid=compute_node_uuid,
            guest=guest if version == TOKEN_VERSION else None,
        )
        return await self.client.call(
            ctx, "check_build", req, version=version, returns=BuildCheck, idempotent=True
        )

    async def check_move(
        self, ctx: RequestContext, migration_uuid: UUID, compute_node_uuid: UUID
    ) -> BuildCheck | None:
        """Whether the move still waits for its copy on this node; ``None`` while the cap
        is below :data:`CHECK_MOVE_VERSION` (a conductor of an older release cannot say)."""
        if not await self.client.can_send_version(CHECK_MOVE_VERSION):
            return None
        req = CheckMove(migration_uuid=migration_uuid, compute_node_uuid=compute_node_uuid)
        return await self.client.call(
            ctx, "check_move", req, version=CHECK_MOVE_VERSION, returns=BuildCheck, idempotent=True
        )

    async def take_request(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        *,
        task: str | None = None,
        node_uuid: UUID | None = None,
    ) -> bool:
        """Take the request ``ctx`` carries before acting on the instance; False if keel-api
        withdrew it (or, with ``task``, if that task ended or the instance is not on
        ``node_uuid``). True without asking while the conductor cap is below
        :data:`TAKE_VERSION` (a conductor of an older release cannot say)."""
        if not await self.client.can_send_version(TAKE_VERSION):
            return True
        version = TAKE_VERSION
        if task is not None:
            if not await self.client.can_send_version(TAKE_CURRENT_VERSION):
                raise ServiceTooOld(
                    f"taking a request for task {task} needs conductor RPC "
                    f"{TAKE_CURRENT_VERSION}; the cap is {await self.client.cap()}"
                )
            version = TAKE_CURRENT_VERSION
        req = TakeRequest(
            instance_uuid=instance_uuid, request_id=ctx.request_id, task=task, node_uuid=node_uuid
        )
        answer = await self.client.call(
            ctx,
            "take_request",
            req,
            version=version,
            returns=RequestTaken,
            idempotent=True,
            timeout=min(TAKE_TIMEOUT, self.client.timeout),
        )
        return answer.proceed

    async def instance_action_result(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        action: PowerAction,
        *,
        success: bool,
        message: str = "",
    ) -> None:
        req = InstanceActionResult(
            instance_uuid=instance_uuid, action=action, success=success, message=message
        )
        await self.client.cast(
            ctx, "instance_action_result", req, version=ACTION_RESULT_SINCE[action]
        )

    async def can_take_action_result(self, action: PowerAction) -> bool:
        """Whether the conductor cap lets the result of ``action`` be reported."""
        return await self.client.can_send_version(ACTION_RESULT_SINCE[action])

    async def instance_deleted(self, ctx: RequestContext, instance_uuid: UUID) -> None:
        req = InstanceDeleted(instance_uuid=instance_uuid)
        await self.client.cast(ctx, "instance_deleted", req, version="1.0")

    async def can_unshelve(self) -> bool:
        """Whether the conductor cap allows a shelve and an unshelve (1.18)."""
        return await self.client.can_send_version(SHELVE_VERSION)

    async def unshelve_instance(
        self,
        ctx: RequestContext,
        instance_uuid: UUID,
        requested_destination: RequestedDestination | None = None,
    ) -> None:
        req = UnshelveInstance(
            instance_uuid=instance_uuid, requested_destination=requested_destination
        )
        await self.client.cast(ctx, "unshelve_instance", req, version=SHELVE_VERSION)

    async def evacuate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        req = EvacuateInstance(migration_uuid=migration_uuid)
        await self.client.cast(ctx, "evacuate_instance", req, version="1.4")

    async def move_result(
        self, ctx: RequestContext, migration_uuid: UUID, *, success: bool, message: str = ""
    ) -> None:
        req = MoveResult(migration_uuid=migration_uuid, success=success, message=message)
        await self.client.cast(ctx, "move_result", req, version="1.4")

    async def report_guests(
        self,
        ctx: RequestContext,
        compute_node_uuid: UUID,
        guests: list[UUID],
        power: dict[UUID, PowerState] | None = None,
        tokens: dict[UUID, UUID | None] | None = None,
    ) -> GuestsReport | None:
        """What the agent's guests are to become; ``None`` if the conductor cannot say."""
        if not await self.client.can_send_version("1.4"):
            return None
        version = "1.7" if await self.client.can_send_version("1.7") else "1.4"
        if await self.client.can_send_version(TOKEN_VERSION):
            version = TOKEN_VERSION
        else:
            tokens = None
        req = ReportGuests(
            compute_node_uuid=compute_node_uuid, guests=guests, power=power or {}, tokens=tokens
        )
        return await self.client.call(
            ctx, "report_guests", req, version=version, returns=GuestsReport
        )

    async def evacuation_confirmed(
        self, ctx: RequestContext, migration_uuid: UUID, compute_node_uuid: UUID
    ) -> None:
        req = EvacuationConfirmed(
            migration_uuid=migration_uuid, compute_node_uuid=compute_node_uuid
        )
        await self.client.call(ctx, "evacuation_confirmed", req, version="1.4")

    async def can_migrate(self) -> bool:
        """Whether the conductor cap allows cold migration (1.5)."""
        return await self.client.can_send_version("1.5")

    async def migrate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        req = MigrateInstance(migration_uuid=migration_uuid)
        await self.client.cast(ctx, "migrate_instance", req, version="1.5")

    async def can_resize(self) -> bool:
        """Whether the conductor cap allows a resize (1.10)."""
        return await self.client.can_send_version(RESIZE_VERSION)

    async def resize_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        req = ResizeInstance(migration_uuid=migration_uuid)
        await self.client.cast(ctx, "resize_instance", req, version=RESIZE_VERSION)

    async def confirm_migration(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        req = ConfirmMigration(migration_uuid=migration_uuid)
        await self.client.cast(ctx, "confirm_migration", req, version="1.5")

    async def revert_migration(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        req = RevertMigration(migration_uuid=migration_uuid)
        await self.client.cast(ctx, "revert_migration", req, version="1.5")

    async def copy_removed(
        self, ctx: RequestContext, migration_uuid: UUID, compute_node_uuid: UUID
    ) -> None:
        req = CopyRemoved(migration_uuid=migration_uuid, compute_node_uuid=compute_node_uuid)
        await self.client.call(ctx, "copy_removed", req, version="1.5")
