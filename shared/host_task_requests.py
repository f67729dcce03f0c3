"""Asking for a host task: the checks and the row, the same from keel-manage and the API.

:func:`start` checks the request and records a running task (``host_tasks``); the
conductors' sweep (:mod:`services.conductor.host_tasks`) does the rest, so the caller
may exit at once. A host has at most one running task: asking again for the same kind
**resumes** it (the running task is answered, whatever the new request's parallel or
deadline), asking for the other kind is refused while it runs.

What a new task needs:

* **drain**: the host's compute service up (every move needs the source's agent). A
  drain moves each server live where it can; ``cold_fallback`` is the operator's leave
  to move the others cold — shut down, moved, started again — where a server cannot
  move live (stopped), its live migration failed, or the deployment does not
  speak live migration yet. Without it those servers stay, and the task ends failed
  naming them;
* **evacuate**: the host fenced, by :func:`shared.host_fencing.fence_state` — the rule
  every evacuation obeys. A host that is only waiting for its fence's lease to run out
  (``seconds_left``) gets a task that waits for it; one that is up, or down without an
  armed fence and not forced down, is refused with the reason ``evacuate`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared import host_fencing
from shared.context import RequestContext
from shared.db import host_tasks, services
from shared.db.pool import Connection
from shared.exceptions import Conflict, HostTaskRefused, ServiceNotFound
from shared.objects.host_task import HostTask, TaskKind
from shared.objects.service import Service

#: The defaults and bounds of a request.
DEFAULT_PARALLEL = 2
MAX_PARALLEL = 100
DEFAULT_DEADLINE = 3600.0
MAX_DEADLINE = 7 * 86400.0


@dataclass(frozen=True)
class TaskRequest:
    kind: TaskKind
    host: str
    parallel: int = DEFAULT_PARALLEL
    cold_fallback: bool = False
    #: Seconds from now until the task ends failed with what is left.
    deadline: float = DEFAULT_DEADLINE

    def check(self) -> None:
        """Refuse values out of range, saying which."""
        if not 1 <= self.parallel <= MAX_PARALLEL:
            raise HostTaskRefused(
                f"parallel must be between 1 and {MAX_PARALLEL}; got {self.parallel}."
            )
        if not 1 <= self.deadline <= MAX_DEADLINE:
            raise HostTaskRefused(
                f"deadline must be between 1 and {MAX_DEADLINE:.0f} seconds; got {self.deadline:g}."
            )
        if not 0 < len(self.host) <= 255:
            raise HostTaskRefused("host must be a compute host's name (1 to 255 characters).")


async def start(
    conn: Connection,
    ctx: RequestContext,
    request: TaskRequest,
    *,
    down_time: float,
    margin: float,
) -> tuple[HostTask, bool]:
    """The host's new task, or its running one of the same kind; with whether it is new.

    ``ServiceNotFound`` for an unknown host, ``Conflict`` while a task of the other kind
    runs on it or the host is down for a drain, ``HostTaskRefused`` for a request that
    cannot be carried out as asked.
    """
    request.check()
    service = await services.find_compute(conn, request.host, down_time)
    if service is None:
        raise ServiceNotFound(f"Compute host {request.host} could not be found.")
    running = await host_tasks.running_on(conn, service.id)
    new = False
    if running is None:
        silent = await host_fencing.silent_for(conn, service.id)
        _refuse_new(request, service, silent, down_time=down_time, margin=margin)
        running, new = await host_tasks.start(
            conn,
            ctx,
            kind=request.kind.value,
            service=service,
            parallel=request.parallel,
            cold_fallback=request.cold_fallback,
            deadline=request.deadline,
        )
    if running.kind != request.kind.value:
        raise Conflict(
            f"Cannot {request.kind.value} {request.host}: host task {running.id} "
            f"({running.kind}) runs on it; wait for it to end (keel-manage host task "
            f"{running.id})."
        )
    return running, new


def _refuse_new(
    request: TaskRequest,
    service: Service,
    silent: float | None,
    *,
    down_time: float,
    margin: float,
) -> None:
    host = service.host
    if request.kind is TaskKind.DRAIN:
        if not service.is_up:
            raise Conflict(
                f"Cannot drain {host}: its compute service is down, and moving a server "
                "away needs its agent. Start the agent, or evacuate the host once it is "
                "fenced (keel-manage host evacuate)."
            )
        return
    state = host_fencing.fence_state(service, silent, down_time=down_time, margin=margin)
    if not state.fenced and state.seconds_left is None:
        raise HostTaskRefused(state.why)
