"""A row of ``migrations``: one move of an instance between compute nodes.

Also the kinds of move keel has (:class:`MoveKind`: evacuation and cold migration) and
the instance-action names of the move workflow, shared by keel-api and keel-conductor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from shared.objects.base import KeelModel
from shared.objects.flavor import FlavorSnapshot
from shared.objects.states import TaskState, VmState


class MigrationType(StrEnum):
    """Nova's move types; keel has evacuation, cold migration and resize."""

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
    #: Ended because the server was deleted during the move, or a live migration aborted.
    CANCELLED = "cancelled"
    #: A live migration: the destination is claimed and prepares.
    PREPARING = "preparing"
    #: A live migration: the source copies the guest's memory to the destination.
    RUNNING = "running"
    #: A live migration: the source's guest is paused and the destination's starts.
    POST_MIGRATING = "post-migrating"


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
    #: A resize's flavors: the server's before, and the one it is resized to.
    old_flavor: FlavorSnapshot | None = None
    new_flavor: FlavorSnapshot | None = None
    #: An evacuation waiting until then for its source's fence (see
    #: :mod:`services.conductor.moves.held`).
    held_until: datetime | None = None
    #: When the source's agent reported the evacuated guest shut down, keeping it so
    #: (:func:`services.conductor.guests.verdicts.report_guests`).
    source_off_at: datetime | None = None
    #: The token of the copy the move started from: what a revert makes current again.
    source_token: UUID | None = None
    #: An evacuation that ends with the server stopped on its new host whatever its state
    #: before (asked for at compute microversion 2.95 or later).
    end_stopped: bool = False
    #: A live migration whose named host skips the scheduler's filters (2.30 to 2.67).
    forced: bool = False
    #: A live migration asked to finish its copy now (``force_complete``, 2.22).
    force_complete: bool = False
    #: A live migration's progress, as its source reports it (bytes).
    memory_total_bytes: int | None = None
    memory_processed_bytes: int | None = None
    memory_remaining_bytes: int | None = None
    disk_total_bytes: int | None = None
    disk_processed_bytes: int | None = None
    disk_remaining_bytes: int | None = None

    @property
    def in_place(self) -> bool:
        """A resize that landed on its own host: one copy, resized in place."""
        return (
            self.migration_type == MigrationType.RESIZE
            and self.dest_compute_id is not None
            and self.dest_compute_id == self.source_compute_id
        )

    @property
    def is_cold(self) -> bool:
        """A cold migration or a resize (both end with confirm or revert)."""
        return self.migration_type in (MigrationType.MIGRATION, MigrationType.RESIZE)


#: Instance-action names (Nova's) of the end of a cold migration.
CONFIRM_ACTION = "confirmResize"
REVERT_ACTION = "revertResize"


@dataclass(frozen=True)
class MoveKind:
    """What differs between an evacuation, a cold migration and a live migration."""

    migration_type: MigrationType
    #: The instance action recorded (Nova's name), which is also the API action's name.
    action: str
    #: The vm states a server may be moved from.
    movable: tuple[VmState, ...]
    #: The instance's task while the destination is chosen, and then while it builds.
    choosing: TaskState
    building: TaskState
    #: Whether no valid host leaves the instance in ERROR (its host is gone) or as it was.
    no_host_is_error: bool


EVACUATION = MoveKind(
    MigrationType.EVACUATION,
    "evacuate",
    (VmState.ACTIVE, VmState.STOPPED, VmState.ERROR),
    TaskState.REBUILDING,
    TaskState.REBUILDING,
    True,
)
MIGRATION = MoveKind(
    MigrationType.MIGRATION,
    "migrate",
    (VmState.ACTIVE, VmState.STOPPED),
    TaskState.RESIZE_PREP,
    TaskState.RESIZE_MIGRATING,
    False,
)
#: A cold migration with a new flavor (Nova's instance action and record type ``resize``).
RESIZE = MoveKind(
    MigrationType.RESIZE,
    "resize",
    (VmState.ACTIVE, VmState.STOPPED),
    TaskState.RESIZE_PREP,
    TaskState.RESIZE_MIGRATING,
    False,
)
#: A live migration: the guest keeps running while its memory is copied (Nova's
#: instance action ``live-migration``, task ``migrating``).
LIVE_MIGRATION = MoveKind(
    MigrationType.LIVE_MIGRATION,
    "live-migration",
    (VmState.ACTIVE, VmState.PAUSED),
    TaskState.MIGRATING,
    TaskState.MIGRATING,
    False,
)
#: ``migration_type`` → its kind.
KINDS = {
    kind.migration_type.value: kind for kind in (EVACUATION, MIGRATION, RESIZE, LIVE_MIGRATION)
}
#: The record types that end with confirm or revert.
COLD = (MigrationType.MIGRATION.value, MigrationType.RESIZE.value)
