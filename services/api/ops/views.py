"""The JSON the operator's page polls: one model per list, built from what keel records.

Every figure that depends on time (seconds since a heartbeat, seconds left before a host
counts as fenced or a move reaches its deadline) is measured by the database's clock
when the answer is made. A later action (a drain, a host task's progress) adds a field
or a model here and a route in :mod:`services.api.ops.data`; nothing else changes.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel

from services.api.servers.views import server_status
from shared.config import Settings
from shared.db.fleet import OpenMove, Recovery, ServerOnHost
from shared.db.recoveries import ComputeHost
from shared.host_fencing import armed_lease, fence_state
from shared.objects.host_task import HostTask, HostTaskItem, TaskCounts
from shared.objects.states import PowerState
from shared.versions import release_name

#: The move statuses a deadline (``KEEL_MOVE_TIMEOUT``) applies to (a live migration's
#: switch-over is carried forward at its deadline, never ended with an error).
TIMED_STATUSES = ("accepted", "pre-migrating", "preparing", "running")


class HostActions(BaseModel):
    """What the page offers for a host now (the API still checks each request)."""

    disable: bool
    enable: bool
    force_down: bool
    force_up: bool
    evacuate: bool
    #: Start a drain (a host task): the host is up and runs no host task.
    drain: bool


class HostView(BaseModel):
    uuid: UUID
    host: str
    zone: str | None
    #: ``up``, ``down``, ``forced down`` or ``fenced`` (silent past its fence's lease and
    #: the margin).
    state: str
    up: bool
    disabled: bool
    disabled_reason: str | None
    forced_down: bool
    #: Its servers may be evacuated: forced down, or silent past its fence's lease.
    fenced: bool
    #: Why it counts as fenced or not (the sentence ``evacuate`` answers with).
    fence_reason: str
    #: Seconds until it counts as fenced, when waiting is all it takes.
    fenced_in: float | None
    #: The lease of its fence as its last heartbeat reported it (seconds); ``None``: no
    #: armed fence (it is evacuated only once forced down).
    fence_lease: float | None
    version: int
    release: str
    #: Seconds since its last heartbeat; ``None``: it never sent one.
    silent_for: float | None
    servers: int
    servers_by_status: dict[str, int]
    #: The number of the host task running on it, if any.
    host_task: int | None = None
    actions: HostActions


class HostsView(BaseModel):
    hosts: list[HostView]
    service_down_time: float
    fencing_margin: float


class ServerView(BaseModel):
    id: UUID
    name: str
    project_id: str
    status: str
    task_state: str | None
    power_state: str


class HostServersView(BaseModel):
    host: str
    servers: list[ServerView]
    #: True when the host holds more servers than the list shows.
    truncated: bool


class MoveView(BaseModel):
    id: UUID
    type: str
    status: str
    server_id: UUID
    server_name: str | None
    source: str | None
    dest: str | None
    user_id: str | None
    #: Who asked, by name when the identity API knows them (else their user id).
    asked_by: str | None
    created_at: datetime
    age: float
    #: Seconds since its record last changed.
    idle: float
    #: Seconds left before the conductors end it (``KEEL_MOVE_TIMEOUT``), or confirm a
    #: finished cold migration (``KEEL_RESIZE_CONFIRM_WINDOW``); ``None``: no deadline.
    deadline_in: float | None
    #: What the deadline does when it comes.
    deadline: str | None
    #: What the move waits for, when it waits for someone: ``None`` otherwise.
    waiting_for: str | None


class MovesView(BaseModel):
    moves: list[MoveView]
    truncated: bool


class RecoveryView(BaseModel):
    host: str
    started_at: datetime
    age: float
    evacuations: int
    skipped: int


class EventsView(BaseModel):
    #: Hosts fenced now: forced down, or silent past their agent's window.
    fenced: list[str]
    #: Fenced hosts whose servers the conductors started evacuating on their own.
    recoveries: list[RecoveryView]
    #: The latest evacuations, by operators (their user id) or the conductors
    #: (``keel-recovery``).
    evacuations: list[MoveView]
    auto_evacuate: str


def _state(host: ComputeHost, fenced: bool) -> str:
    service = host.service
    if service.forced_down:
        return "forced down"
    if service.is_up:
        return "up"
    return "fenced" if fenced else "down"


def host_view(
    host: ComputeHost,
    counts: dict[str, int],
    settings: Settings,
    running_task: int | None = None,
) -> HostView:
    service = host.service
    fencing = fence_state(
        service,
        host.silent_for,
        down_time=settings.service_down_time,
        margin=settings.fencing.margin,
    )
    servers = sum(counts.values())
    return HostView(
        uuid=service.uuid,
        host=service.host,
        zone=host.zone,
        state=_state(host, fencing.fenced),
        up=service.is_up,
        disabled=service.disabled,
        disabled_reason=service.disabled_reason,
        forced_down=service.forced_down,
        fenced=fencing.fenced,
        fence_reason=fencing.why,
        fenced_in=fencing.seconds_left,
        fence_lease=armed_lease(service),
        version=service.version,
        release=release_name(service.version),
        silent_for=host.silent_for,
        servers=servers,
        servers_by_status=counts,
        host_task=running_task,
        actions=HostActions(
            disable=not service.disabled,
            enable=service.disabled,
            force_down=not service.forced_down,
            force_up=service.forced_down,
            evacuate=fencing.fenced and servers > 0,
            drain=service.is_up and running_task is None,
        ),
    )


def server_view(server: ServerOnHost) -> ServerView:
    try:
        power = PowerState(server.power_state).name.lower()
    except ValueError:
        power = str(server.power_state)
    return ServerView(
        id=server.uuid,
        name=server.name,
        project_id=server.project_id,
        status=server_status(server.vm_state, server.task_state),
        task_state=server.task_state,
        power_state=power,
    )


def _deadline(move: OpenMove, settings: Settings) -> tuple[float | None, str | None]:
    if move.status in TIMED_STATUSES and settings.move_timeout > 0:
        return settings.move_timeout - move.idle, "ended with an error (KEEL_MOVE_TIMEOUT)"
    window = settings.resize_confirm_window
    if move.status == "finished" and window > 0:
        return window - move.idle, "confirmed (KEEL_RESIZE_CONFIRM_WINDOW)"
    return None, None


def _waiting_for(move: OpenMove) -> str | None:
    if move.status == "done":
        return f"{move.source}'s agent to remove the old copy (when it starts again)"
    if move.status == "finished":
        return "its owner's confirm or revert"
    if move.status == "post-migrating":
        return f"{move.dest or 'the destination'}'s agent to start the server (the switch-over)"
    return None


def move_view(move: OpenMove, settings: Settings) -> MoveView:
    left, what = _deadline(move, settings)
    return MoveView(
        id=move.uuid,
        type=move.migration_type,
        status=move.status,
        server_id=move.instance_uuid,
        server_name=move.server_name,
        source=move.source,
        dest=move.dest,
        user_id=move.user_id,
        asked_by=move.user_name or move.user_id,
        created_at=move.created_at,
        age=move.age,
        idle=move.idle,
        deadline_in=left,
        deadline=what,
        waiting_for=_waiting_for(move),
    )


class HostTaskItemView(BaseModel):
    server_id: UUID
    name: str
    status: str
    dest: str | None
    message: str | None


class HostTaskView(BaseModel):
    id: UUID
    number: int
    kind: str
    host: str
    #: ``running``, ``done`` or ``failed``.
    status: str
    parallel: int
    #: Seconds left before its deadline (negative once past).
    deadline_in: float
    #: While it runs, what it waits for; once ended, its outcome.
    message: str | None
    asked_by: str | None
    age: float
    counts: dict[str, int]
    total: int
    #: Its servers, for a running task (at most the page's limit).
    items: list[HostTaskItemView]


class HostTasksView(BaseModel):
    tasks: list[HostTaskView]


def host_task_view(
    task: HostTask, counts: TaskCounts, items: list[HostTaskItem], age: float
) -> HostTaskView:
    return HostTaskView(
        id=task.uuid,
        number=task.id,
        kind=task.kind,
        host=task.host,
        status=task.status,
        parallel=task.parallel,
        deadline_in=task.deadline_in,
        message=task.message,
        asked_by=task.user_id,
        age=age,
        counts=counts.model_dump(),
        total=counts.total,
        items=[
            HostTaskItemView(
                server_id=i.instance_uuid,
                name=i.name,
                status=i.status,
                dest=i.dest,
                message=i.message,
            )
            for i in items
        ],
    )


def recovery_view(recovery: Recovery) -> RecoveryView:
    return RecoveryView(
        host=recovery.host,
        started_at=recovery.started_at,
        age=recovery.age,
        evacuations=recovery.evacuations,
        skipped=recovery.skipped,
    )
