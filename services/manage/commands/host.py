"""``keel-manage host``: drain or evacuate a whole compute host, and follow host tasks.

``drain`` and ``evacuate`` record a host task (:mod:`shared.host_task_requests`) that the
conductors carry out (:mod:`services.conductor.host_tasks`), then show its progress until
it ends: exit 0 once every server moved, 1 if it ended failed. The task does not need
this command: Ctrl-C (exit 130) or ``--detach`` (exit 0 once it is recorded) leaves it
running, and starting the same command again resumes watching the same task.
"""

from __future__ import annotations

import argparse
import asyncio

from rich.console import Console
from rich.live import Live

from services.manage.commands import UsageError, set_handler
from services.manage.database import connect
from services.manage.host_task_view import (
    TaskView,
    items_table,
    outcome,
    plain_or_terminal,
    tasks_table,
)
from shared import host_task_requests
from shared.config import Settings
from shared.context import RequestContext
from shared.db import host_tasks
from shared.exceptions import HostTaskRefused, KeelError
from shared.host_task_requests import TaskRequest
from shared.objects.host_task import HostTask, HostTaskItem, TaskKind, TaskStatus

#: Who a task started here names as its user.
MANAGE_USER = "keel-manage"
#: Seconds between two looks at a task being watched.
LOOK_INTERVAL = 1.0
#: Looks in a row that may fail (the database away) before the command gives up.
LOOK_FAILURES = 30
#: The most tasks ``host tasks`` lists.
LIST_LIMIT = 200

DRAIN_HELP = (
    "Move every server off HOST, then leave it disabled for maintenance. The host's "
    "compute service is disabled first (its reason names the task), then its servers are "
    "moved, at most --parallel at once: each ACTIVE or PAUSED server by live migration "
    "(it runs on throughout). With --cold-fallback, a server that cannot move live "
    "(stopped, a live migration that failed or was aborted, services not yet "
    "upgraded) moves by cold migration (shut down, moved, started again on another host, "
    "confirmed on arrival); without it, such a server stays and the task ends failed, "
    "naming it."
)
EVACUATE_HELP = (
    "Rebuild every server of HOST elsewhere, as 'openstack server evacuate' does for one: "
    "only once the host is fenced (forced down, or silent past its fence's lease). A host "
    "whose fence's lease still runs gets a task that waits for it; a host that is up, or "
    "down without an armed fence and not forced down, is refused."
)


async def _look(settings: Settings, task_id: int) -> tuple[HostTask, list[HostTaskItem]]:
    async with connect(settings.database_url) as conn:
        return await host_tasks.get_by_id(conn, task_id), await host_tasks.items(conn, task_id)


async def _next_look(settings: Settings, task: HostTask) -> tuple[HostTask, list[HostTaskItem]]:
    """The task again after a pause; the database may be away for a while meanwhile."""
    for attempt in range(LOOK_FAILURES):
        await asyncio.sleep(LOOK_INTERVAL)
        try:
            return await _look(settings, task.id)
        except KeelError:
            if attempt == LOOK_FAILURES - 1:
                raise
    raise AssertionError("unreachable")


async def watch(settings: Settings, task: HostTask, console: Console) -> HostTask:
    """Show the task's progress until it ends; the task as it ended."""
    task, items = await _look(settings, task.id)
    view = TaskView(console)
    try:
        if console.is_terminal:
            with Live(view.renderable(task, items), console=console, auto_refresh=False) as live:
                while task.running:
                    task, items = await _next_look(settings, task)
                    live.update(view.renderable(task, items), refresh=True)
        else:
            view.line(task, items)
            while task.running:
                task, items = await _next_look(settings, task)
                view.line(task, items)
            console.print(items_table(task, items))
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print(
            f"\nstopped watching: host task {task.id} goes on; follow it with "
            f"'keel-manage host task {task.id} --watch'"
        )
        raise
    console.print(outcome(task))
    return task


def _request(args: argparse.Namespace, kind: TaskKind) -> TaskRequest:
    request = TaskRequest(
        kind=kind,
        host=args.host,
        parallel=args.parallel,
        cold_fallback=getattr(args, "cold_fallback", False),
        deadline=args.deadline,
    )
    try:
        request.check()
    except HostTaskRefused as exc:
        raise UsageError(exc.message) from None
    return request


async def _start(args: argparse.Namespace, settings: Settings, kind: TaskKind) -> int:
    request = _request(args, kind)
    out = plain_or_terminal()
    ctx = RequestContext(user_id=MANAGE_USER, roles=("admin",))
    async with connect(settings.database_url) as conn:
        task, new = await host_task_requests.start(
            conn,
            ctx,
            request,
            down_time=settings.service_down_time,
            margin=settings.fencing.margin,
        )
    if new:
        out.print(
            f"started host task {task.id} ({task.uuid}): {task.kind} of {task.host}, at most "
            f"{task.parallel} moving at once, deadline in {task.deadline_in:.0f}s"
        )
    else:
        out.print(
            f"resuming host task {task.id} ({task.uuid}): {task.kind} of {task.host} started "
            f"{task.created_at.isoformat(timespec='seconds')}, at most {task.parallel} moving "
            "at once (its own settings stay)"
        )
    out.file.flush()
    if args.detach:
        out.print(f"detached: follow it with 'keel-manage host task {task.id} --watch'")
        return 0
    ended = await watch(settings, task, out)
    return 0 if ended.status == TaskStatus.DONE else 1


async def drain(args: argparse.Namespace, settings: Settings) -> int:
    return await _start(args, settings, TaskKind.DRAIN)


async def evacuate(args: argparse.Namespace, settings: Settings) -> int:
    return await _start(args, settings, TaskKind.EVACUATE)


async def list_tasks(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        found = await host_tasks.list_tasks(conn, include_ended=args.all, limit=LIST_LIMIT)
        counts = await host_tasks.counts(conn, [task.id for task in found])
    out = plain_or_terminal()
    if not found:
        out.print("no host tasks" if args.all else "no running host tasks (--all: ended ones too)")
        return 0
    out.print(tasks_table(found, counts))
    return 0


async def show_task(args: argparse.Namespace, settings: Settings) -> int:
    async with connect(settings.database_url) as conn:
        task = await host_tasks.find(conn, args.task)
        if task is None:
            raise KeelError(f"no host task {args.task!r}: see 'keel-manage host tasks --all'")
        items = await host_tasks.items(conn, task.id)
    out = plain_or_terminal()
    if args.watch and task.running:
        task = await watch(settings, task, out)
    else:
        out.print(items_table(task, items))
        out.print(outcome(task))
    return 1 if task.status == TaskStatus.FAILED else 0


def _task_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", metavar="HOST", help="the compute host (its service's host name)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=host_task_requests.DEFAULT_PARALLEL,
        help="at most this many servers moving at once (default %(default)s)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=host_task_requests.DEFAULT_DEADLINE,
        metavar="S",
        help="seconds until the task ends failed with what is left (default %(default).0f)",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="start the task (or find the running one) and return: it goes on without this command",
    )


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    host = commands.add_parser("host", help="drain or evacuate whole compute hosts")
    actions = host.add_subparsers(dest="action", required=True, metavar="ACTION")
    draining = actions.add_parser(
        "drain", help="move every server off a host (cold migration)", description=DRAIN_HELP
    )
    _task_options(draining)
    draining.add_argument(
        "--cold-fallback",
        action="store_true",
        help="allow cold migration (the guest is shut down, moved and started again) where a "
        "server cannot move live",
    )
    set_handler(draining, drain)
    evacuating = actions.add_parser(
        "evacuate",
        help="rebuild every server of a fenced host elsewhere",
        description=EVACUATE_HELP,
    )
    _task_options(evacuating)
    set_handler(evacuating, evacuate)
    listing = actions.add_parser("tasks", help="list running host tasks")
    listing.add_argument("--all", action="store_true", help="ended tasks too (the latest 200)")
    set_handler(listing, list_tasks)
    showing = actions.add_parser("task", help="one host task and its servers")
    showing.add_argument("task", metavar="ID", help="the task's number or uuid")
    showing.add_argument("--watch", action="store_true", help="follow it until it ends")
    set_handler(showing, show_task)
