"""Conductor RPC 1.17: live migration.

* ``live_migrate_instance`` (cast, from keel-api): carry out a recorded live migration.
* ``live_migration_progress`` (call, from the source's agent while it copies): record
  the copy's progress; the answer says go on, abort (the migration was aborted, timed
  out or the server deleted) or complete now (``force_complete``, or the switch-over is
  already under way).
* ``live_migration_switch`` (call, from the source's agent once it paused its guest):
  the destination starts its copy, then the server is linked to it; the answer says
  whether the source removes its copy (``completed``), resumes it (``resume``: the
  migration ended without switching) or leaves it be (``leave``: the server was deleted).
"""

from __future__ import annotations

from enum import StrEnum
from uuid import UUID

from pydantic import Field

from shared.context import RequestContext
from shared.exceptions import ServiceTooOld
from shared.objects.base import KeelModel
from shared.rpc.client import RPCClient

#: The conductor RPC version of live migration.
LIVE_VERSION = "1.17"


class LiveMigrateInstance(KeelModel):
    migration_uuid: UUID


class LiveMigrationProgress(KeelModel):
    migration_uuid: UUID
    #: The reporting (source) node.
    compute_node_uuid: UUID
    memory_total_bytes: int = Field(ge=0)
    memory_processed_bytes: int = Field(ge=0)
    disk_total_bytes: int = Field(ge=0)
    disk_processed_bytes: int = Field(ge=0)


class LiveAction(StrEnum):
    CONTINUE = "continue"
    ABORT = "abort"
    COMPLETE = "complete"


class LiveDirective(KeelModel):
    action: LiveAction
    reason: str = Field(default="", max_length=1000)


class LiveMigrationSwitch(KeelModel):
    migration_uuid: UUID
    compute_node_uuid: UUID


class SwitchOutcome(StrEnum):
    #: The destination's copy is the server: remove this one.
    COMPLETED = "completed"
    #: The migration ended without switching over: resume this copy.
    RESUME = "resume"
    #: Nothing for the source to do (the server was deleted).
    LEAVE = "leave"


class LiveSwitch(KeelModel):
    outcome: SwitchOutcome
    reason: str = Field(default="", max_length=1000)


class LiveConductorAPI:
    """The live migration methods, on the client of a ``ConductorAPI``."""

    def __init__(self, client: RPCClient) -> None:
        self.client = client

    async def can_live_migrate(self) -> bool:
        return await self.client.can_send_version(LIVE_VERSION)

    async def _check(self, method: str) -> None:
        if not await self.client.can_send_version(LIVE_VERSION):
            raise ServiceTooOld(
                f"{method} needs conductor RPC {LIVE_VERSION}; the cap is {await self.client.cap()}"
            )

    async def live_migrate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        await self._check("live_migrate_instance")
        req = LiveMigrateInstance(migration_uuid=migration_uuid)
        await self.client.cast(ctx, "live_migrate_instance", req, version=LIVE_VERSION)

    async def live_migration_progress(
        self,
        ctx: RequestContext,
        migration_uuid: UUID,
        compute_node_uuid: UUID,
        *,
        memory: tuple[int, int],
        disk: tuple[int, int],
    ) -> LiveDirective:
        """Report ``(total, processed)`` bytes of memory and disk; what to do next."""
        await self._check("live_migration_progress")
        req = LiveMigrationProgress(
            migration_uuid=migration_uuid,
            compute_node_uuid=compute_node_uuid,
            memory_total_bytes=memory[0],
            memory_processed_bytes=memory[1],
            disk_total_bytes=disk[0],
            disk_processed_bytes=disk[1],
        )
        return await self.client.call(
            ctx,
            "live_migration_progress",
            req,
            version=LIVE_VERSION,
            returns=LiveDirective,
            idempotent=True,
        )

    async def live_migration_switch(
        self, ctx: RequestContext, migration_uuid: UUID, compute_node_uuid: UUID
    ) -> LiveSwitch:
        await self._check("live_migration_switch")
        req = LiveMigrationSwitch(
            migration_uuid=migration_uuid, compute_node_uuid=compute_node_uuid
        )
        return await self.client.call(
            ctx,
            "live_migration_switch",
            req,
            version=LIVE_VERSION,
            returns=LiveSwitch,
            idempotent=True,
        )
