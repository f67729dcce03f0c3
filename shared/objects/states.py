"""Instance states, with Nova's names so the API can show them as the client expects."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class VmState(StrEnum):
    BUILDING = "building"
    ACTIVE = "active"
    STOPPED = "stopped"
    #: A cold migration finished and awaits confirm or revert (status VERIFY_RESIZE).
    RESIZED = "resized"
    #: The guest's vCPUs are stopped, its memory kept in place (status PAUSED).
    PAUSED = "paused"
    #: The guest's memory is saved to disk and it no longer runs (status SUSPENDED).
    SUSPENDED = "suspended"
    ERROR = "error"
    #: Deleted by its owner with soft delete on (``KEEL_RECLAIM_INSTANCE_INTERVAL``): the
    #: guest is off, claims and addresses kept, until restored, force-deleted or
    #: reclaimed (status SOFT_DELETED; Nova's name).
    SOFT_DELETED = "soft-delete"
    #: Shelved (``shelve``): the guest is off on its host and a snapshot of its disk is
    #: kept as an image; its claim is kept (status SHELVED).
    SHELVED = "shelved"
    #: Shelved and offloaded: the guest is gone from its host, its claim released, and
    #: only the shelved image holds its disk (status SHELVED_OFFLOADED; no host).
    SHELVED_OFFLOADED = "shelved_offloaded"
    DELETED = "deleted"


class TaskState(StrEnum):
    SCHEDULING = "scheduling"
    SPAWNING = "spawning"
    DELETING = "deleting"
    POWERING_OFF = "powering-off"
    POWERING_ON = "powering-on"
    REBOOTING = "rebooting"
    REBOOTING_HARD = "rebooting_hard"
    #: An evacuation: the instance is rebuilt on another host.
    REBUILDING = "rebuilding"
    #: A rebuild (``rebuild`` action): the guest is made again from a new image, on its
    #: own host (status REBUILD, as an evacuation's).
    REBUILD_SPAWNING = "rebuild_spawning"
    #: A cold migration: preparing, then copying to the destination.
    RESIZE_PREP = "resize_prep"
    RESIZE_MIGRATING = "resize_migrating"
    #: Confirming or reverting a finished cold migration.
    RESIZE_CONFIRMING = "resize_confirming"
    RESIZE_REVERTING = "resize_reverting"
    #: A live migration: the guest runs on while it is copied to another host.
    MIGRATING = "migrating"
    PAUSING = "pausing"
    UNPAUSING = "unpausing"
    SUSPENDING = "suspending"
    RESUMING = "resuming"
    #: A delete with soft delete on: the guest is being powered off.
    SOFT_DELETING = "soft-deleting"
    #: A soft-deleted server is being restored: the guest is being powered on.
    RESTORING = "restoring"
    #: A snapshot (``createImage``): asked of the agent, its upload about to begin, then
    #: the disk's data streaming into the image store (Nova's three names).
    IMAGE_SNAPSHOT = "image_snapshot"
    IMAGE_PENDING_UPLOAD = "image_pending_upload"
    IMAGE_UPLOADING = "image_uploading"
    #: A shelve: the agent powers the guest off and writes its disk into the shelved
    #: image; then the offload: the guest destroyed on its host (Nova's names).
    SHELVING = "shelving"
    SHELVING_OFFLOADING = "shelving_offloading"
    #: An unshelve: a shelved guest powered on again, or an offloaded server scheduled
    #: again (then ``spawning`` on its new host, from the shelved image).
    UNSHELVING = "unshelving"


#: The tasks of a snapshot, in their order.
SNAPSHOT_TASKS = (
    TaskState.IMAGE_SNAPSHOT,
    TaskState.IMAGE_PENDING_UPLOAD,
    TaskState.IMAGE_UPLOADING,
)


class PowerState(IntEnum):
    NOSTATE = 0
    RUNNING = 1
    PAUSED = 3
    SHUTDOWN = 4
    CRASHED = 6
    SUSPENDED = 7
