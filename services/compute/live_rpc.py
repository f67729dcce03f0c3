"""Compute RPC 1.16: live migration, as the conductor asks the agents for it.

* ``prepare_live_migration`` (call, to the destination): check that this host can take
  the server's copy (no copy of it here already that another move made; a driver that
  can move a running guest) before the source starts copying.
* ``live_migrate`` (cast, to the source): copy the guest's memory to the destination,
  reporting progress to the conductor (``live_migration_progress``), which answers go
  on, abort or complete; at the switch-over pause the guest and ask the conductor to
  switch (``live_migration_switch``), then remove this copy or resume it as answered.
* ``start_live_copy`` (call, to the destination): start the server's copy here, carrying
  the move's copy token (its ``origin``); the source's guest is paused meanwhile.
* ``rollback_live_migration`` (call, to the source): the migration ended without a
  switch-over; resume the guest if the migration left it paused.

A fleet below 1.16 cannot live-migrate: keel-api refuses with 409 naming the agents.

1.18: a destination whose driver moves guests itself (libvirt) answers
``prepare_live_migration`` with a :class:`LiveTarget` (having made the guest's directory
ready to receive it), and ``live_migrate`` carries it to the source, whose driver then
moves the guest instead of the simulated copy; the destination's ``start_live_copy``
resumes the guest that arrived instead of starting a copy. An agent below 1.18 is asked
as at 1.16 (its prepare answers nothing; a source below 1.18 is sent no target).
"""

from __future__ import annotations

from uuid import UUID

from pydantic import Field

from services.compute.rpcapi import ComputeAPI, InstanceSpec, topic_for
from shared.context import RequestContext
from shared.exceptions import ServiceTooOld
from shared.objects.base import KeelModel
from shared.rpc.client import RPCClient

#: The compute RPC version of live migration.
LIVE_VERSION = "1.16"
#: The compute RPC version whose prepare answers a :class:`LiveTarget`.
TARGET_VERSION = "1.18"
#: The live migration methods (all first in :data:`LIVE_VERSION`).
LIVE_METHODS = (
    "prepare_live_migration",
    "live_migrate",
    "start_live_copy",
    "rollback_live_migration",
)


class PrepareLiveMigration(KeelModel):
    """To the destination: get ready to take ``instance`` for ``migration_uuid``."""

    instance: InstanceSpec
    migration_uuid: UUID


class LiveTarget(KeelModel):
    """How the destination takes a guest its driver receives (1.18)."""

    #: The driver's name (only a source of the same driver can use it).
    driver: str = Field(max_length=64)
    #: Where the source's driver connects (libvirt: the destination daemon's URI).
    uri: str = Field(max_length=1000)
    #: The address the destination listens on for the guest's memory and disk.
    address: str = Field(max_length=255)
    #: The guest's definition on the destination (libvirt: its domain XML, with its own
    #: paths, name, forwards and metadata), which the source's driver merges into its own.
    definition: str = Field(max_length=1_000_000)


class LivePrepared(KeelModel):
    """What prepare_live_migration answers (1.18): ``None`` means simulated copy."""

    target: LiveTarget | None = None


class LiveMigrate(KeelModel):
    """To the source: copy the guest to the destination, then switch over."""

    instance_uuid: UUID
    migration_uuid: UUID
    #: The server is PAUSED: its guest stays paused, here and on the destination.
    paused: bool = False
    #: What there is to copy: the flavor's memory and disk.
    memory_mb: int = Field(ge=0)
    disk_gb: int = Field(ge=0)
    #: The destination's answer to prepare (1.18): the driver moves the guest there.
    target: LiveTarget | None = None


class StartLiveCopy(KeelModel):
    """To the destination: start the server's copy here (the source's is paused)."""

    instance: InstanceSpec
    migration_uuid: UUID
    #: Leave the copy paused (the server was PAUSED).
    paused: bool = False


class RollbackLiveMigration(KeelModel):
    """To the source: the migration ended without switching over; resume the guest if
    it left it paused (and the server is not PAUSED)."""

    instance_uuid: UUID
    migration_uuid: UUID
    resume: bool = True


class LiveComputeAPI:
    """The live migration methods, on the client of a :class:`ComputeAPI`."""

    def __init__(self, compute: ComputeAPI) -> None:
        self.client: RPCClient = compute.client

    async def _live_client(self, service_uuid: UUID, method: str) -> RPCClient:
        client = self.client.for_topic(topic_for(service_uuid))
        if not await client.can_send_version(LIVE_VERSION):
            raise ServiceTooOld(
                f"{method} needs compute RPC {LIVE_VERSION}; the cap is {await client.cap()}"
            )
        return client

    async def prepare_live_migration(
        self, ctx: RequestContext, service_uuid: UUID, spec: InstanceSpec, migration_uuid: UUID
    ) -> LiveTarget | None:
        """The destination's :class:`LiveTarget`; ``None`` from an agent below 1.18 or a
        driver that does not move guests itself."""
        method = "prepare_live_migration"
        client = await self._live_client(service_uuid, method)
        req = PrepareLiveMigration(instance=spec, migration_uuid=migration_uuid)
        if await client.can_send_version(TARGET_VERSION):
            answer = await client.call(
                ctx, method, req, version=TARGET_VERSION, returns=LivePrepared, idempotent=True
            )
            return answer.target
        await client.call(ctx, method, req, version=LIVE_VERSION, idempotent=True)
        return None

    async def live_migrate(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance_uuid: UUID,
        migration_uuid: UUID,
        *,
        paused: bool,
        memory_mb: int,
        disk_gb: int,
        target: LiveTarget | None = None,
    ) -> None:
        """A ``target`` goes only to a source of 1.18 or later; an older one simulates the
        copy (and the destination's driver, finding no guest arrived, fails the switch)."""
        method = "live_migrate"
        client = await self._live_client(service_uuid, method)
        version = LIVE_VERSION
        if target is not None and await client.can_send_version(TARGET_VERSION):
            version = TARGET_VERSION
        else:
            target = None
        req = LiveMigrate(
            instance_uuid=instance_uuid,
            migration_uuid=migration_uuid,
            paused=paused,
            memory_mb=memory_mb,
            disk_gb=disk_gb,
            target=target,
        )
        await client.cast(ctx, method, req, version=version)

    async def start_live_copy(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        spec: InstanceSpec,
        migration_uuid: UUID,
        *,
        paused: bool,
    ) -> None:
        method = "start_live_copy"
        client = await self._live_client(service_uuid, method)
        req = StartLiveCopy(instance=spec, migration_uuid=migration_uuid, paused=paused)
        await client.call(ctx, method, req, version=LIVE_VERSION, idempotent=True)

    async def rollback_live_migration(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance_uuid: UUID,
        migration_uuid: UUID,
        *,
        resume: bool,
    ) -> None:
        method = "rollback_live_migration"
        client = await self._live_client(service_uuid, method)
        req = RollbackLiveMigration(
            instance_uuid=instance_uuid, migration_uuid=migration_uuid, resume=resume
        )
        await client.call(ctx, method, req, version=LIVE_VERSION, idempotent=True)
