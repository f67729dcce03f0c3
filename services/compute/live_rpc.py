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


class LiveMigrate(KeelModel):
    """To the source: copy the guest to the destination, then switch over."""

    instance_uuid: UUID
    migration_uuid: UUID
    #: The server is PAUSED: its guest stays paused, here and on the destination.
    paused: bool = False
    #: What there is to copy: the flavor's memory and disk.
    memory_mb: int = Field(ge=0)
    disk_gb: int = Field(ge=0)


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
    ) -> None:
        method = "prepare_live_migration"
        client = await self._live_client(service_uuid, method)
        req = PrepareLiveMigration(instance=spec, migration_uuid=migration_uuid)
        await client.call(ctx, method, req, version=LIVE_VERSION, idempotent=True)

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
    ) -> None:
        method = "live_migrate"
        client = await self._live_client(service_uuid, method)
        req = LiveMigrate(
            instance_uuid=instance_uuid,
            migration_uuid=migration_uuid,
            paused=paused,
            memory_mb=memory_mb,
            disk_gb=disk_gb,
        )
        await client.cast(ctx, method, req, version=LIVE_VERSION)

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
