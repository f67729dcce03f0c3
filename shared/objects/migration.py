"""A row of ``migrations``: one move of an instance between compute nodes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from shared.objects.base import KeelModel


class MigrationType(StrEnum):
    MIGRATION = "migration"
    RESIZE = "resize"
    LIVE_MIGRATION = "live-migration"
    EVACUATION = "evacuation"


class MigrationStatus(StrEnum):
    """The statuses keel uses, with Nova's names.

    An evacuation goes accepted → pre-migrating → done → completed (once the source
    agent removed its copy), or ends in error (no host found) or failed (the
    destination could not rebuild). A cold migration goes accepted → pre-migrating →
    finished, then confirmed or reverted.
    """

    ACCEPTED = "accepted"
    PRE_MIGRATING = "pre-migrating"
    DONE = "done"
    COMPLETED = "completed"
    FINISHED = "finished"
    CONFIRMING = "confirming"
    CONFIRMED = "confirmed"
    REVERTING = "reverting"
    REVERTED = "reverted"
    ERROR = "error"
    FAILED = "failed"


class Migration(KeelModel):
    id: int
    uuid: UUID
    instance_uuid: UUID
    migration_type: str
    status: str
    source_compute: str | None
    source_node: str | None
    source_compute_id: int | None
    dest_compute: str | None
    dest_node: str | None
    dest_compute_id: int | None
    dest_host: str | None
    user_id: str | None
    project_id: str | None
    created_at: datetime
    updated_at: datetime | None
    deleted_at: datetime | None
