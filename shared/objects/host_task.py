"""Rows of ``host_tasks`` and ``host_task_items``: a whole-host operation and its servers.

A **host task** drains a host (every server moved away while the host runs, the host
disabled first) or evacuates one (every server of a fenced host rebuilt elsewhere). The
conductors carry it out (:mod:`services.conductor.host_tasks`); keel-manage and the API
start it and show its progress.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from shared.objects.base import KeelModel


class TaskKind(StrEnum):
    DRAIN = "drain"
    EVACUATE = "evacuate"


class TaskStatus(StrEnum):
    RUNNING = "running"
    #: Every server of the host moved (or no longer needed moving).
    DONE = "done"
    #: It ended with servers left on the host: ``message`` says why.
    FAILED = "failed"


class ItemStatus(StrEnum):
    PENDING = "pending"
    MOVING = "moving"
    MOVED = "moved"
    FAILED = "failed"
    #: The server no longer needs moving: it was deleted, or left the host otherwise.
    SKIPPED = "skipped"


#: Item statuses still to be worked on.
OPEN_ITEMS = (ItemStatus.PENDING.value, ItemStatus.MOVING.value)


class HostTask(KeelModel):
    id: int
    uuid: UUID
    kind: str
    service_id: int
    host: str
    status: str
    parallel: int
    cold_fallback: bool
    deadline: datetime
    user_id: str | None
    project_id: str | None
    message: str | None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    #: Computed by the query, by the database's clock: seconds until ``deadline``.
    deadline_in: float = 0.0

    @property
    def running(self) -> bool:
        return self.status == TaskStatus.RUNNING


class HostTaskItem(KeelModel):
    id: int
    task_id: int
    instance_uuid: UUID
    name: str
    status: str
    migration_uuid: UUID | None
    dest: str | None
    message: str | None
    created_at: datetime
    updated_at: datetime


class TaskCounts(KeelModel):
    """How many of a task's servers are in each item status."""

    pending: int = 0
    moving: int = 0
    moved: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.moving + self.moved + self.failed + self.skipped

    @property
    def finished(self) -> int:
        """Servers the task is done with, whatever the outcome."""
        return self.moved + self.failed + self.skipped
