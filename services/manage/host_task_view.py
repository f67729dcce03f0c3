"""How keel-manage shows a host task: a progress bar and a per-server table (``rich``).

On a terminal the view is redrawn in place as the task moves on (``rich.live.Live``);
anywhere else (a pipe, a log file, CI) one line is printed each time the counts change,
and the table once at the end, so the output stays readable as plain text.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from shared.objects.host_task import HostTask, HostTaskItem, ItemStatus, TaskCounts

#: The width of the output when it is not a terminal (a pipe, a log file).
PLAIN_WIDTH = 160
#: Each item status's colour in the table.
STYLES = {
    ItemStatus.PENDING.value: "dim",
    ItemStatus.MOVING.value: "yellow",
    ItemStatus.MOVED.value: "green",
    ItemStatus.FAILED.value: "bold red",
    ItemStatus.SKIPPED.value: "cyan",
}
TASK_STYLES = {"running": "yellow", "done": "bold green", "failed": "bold red"}


def plain_or_terminal() -> Console:
    """The console keel-manage prints a task to: the terminal's width, or a wide page."""
    found = Console(highlight=False)
    return found if found.is_terminal else Console(highlight=False, width=PLAIN_WIDTH)


def counts_of(items: list[HostTaskItem]) -> TaskCounts:
    found: dict[str, int] = {}
    for item in items:
        found[item.status] = found.get(item.status, 0) + 1
    return TaskCounts(**found)


def title(task: HostTask) -> str:
    return f"host task {task.id}: {task.kind} of {task.host}"


def summary(task: HostTask, counts: TaskCounts) -> str:
    """One line: where the task stands."""
    line = (
        f"{title(task)} [{task.status}]: {counts.moved} moved, {counts.moving} moving, "
        f"{counts.pending} pending, {counts.failed} failed, {counts.skipped} skipped "
        f"of {counts.total}"
    )
    if task.running:
        line += f"; deadline in {max(0.0, task.deadline_in):.0f}s"
    return line


def items_table(task: HostTask, items: list[HostTaskItem]) -> Table:
    table = Table(title=f"{title(task)}: servers", title_justify="left", expand=False)
    table.add_column("Server")
    table.add_column("ID", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("To")
    table.add_column("Detail", overflow="fold")
    for item in sorted(items, key=lambda i: (i.name, str(i.instance_uuid))):
        table.add_row(
            item.name or "-",
            str(item.instance_uuid),
            Text(item.status, style=STYLES.get(item.status, "")),
            item.dest or "",
            item.message or "",
        )
    return table


def outcome(task: HostTask) -> Text:
    text = Text(f"{title(task)}: ", style="bold")
    text.append(task.status, style=TASK_STYLES.get(task.status, ""))
    if task.message:
        text.append(f": {task.message}")
    return text


def tasks_table(tasks: list[HostTask], counts: dict[int, TaskCounts]) -> Table:
    table = Table(title="host tasks", title_justify="left")
    for column in ("ID", "Kind", "Host", "Status", "Moved", "Moving", "Failed", "Deadline in"):
        table.add_column(column, no_wrap=True)
    table.add_column("Started", no_wrap=True)
    table.add_column("Message", overflow="fold")
    for task in tasks:
        count = counts.get(task.id, TaskCounts())
        table.add_row(
            str(task.id),
            task.kind,
            task.host,
            Text(task.status, style=TASK_STYLES.get(task.status, "")),
            f"{count.moved}/{count.total}",
            str(count.moving),
            str(count.failed),
            f"{task.deadline_in:.0f}s" if task.running else "-",
            task.created_at.isoformat(timespec="seconds"),
            task.message or "",
        )
    return table


class TaskView:
    """The progress bar and table of one task, redrawn with each new look at it."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
        )
        self.bar = self.progress.add_task("", total=None, detail="")
        self._last = ""

    def renderable(self, task: HostTask, items: list[HostTaskItem]) -> Group:
        counts = counts_of(items)
        detail = f"{counts.moving} moving, {counts.failed} failed"
        if task.running and task.message:
            detail += f" ({task.message})"
        self.progress.update(
            self.bar,
            description=title(task),
            total=max(counts.total, 1),
            completed=counts.finished,
            detail=detail,
        )
        return Group(self.progress, items_table(task, items))

    def line(self, task: HostTask, items: list[HostTaskItem]) -> None:
        """Print the summary line if it changed (for output that is not a terminal)."""
        line = summary(task, counts_of(items)).rsplit("; deadline in", 1)[0]
        if line != self._last:
            self._last = line
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)
            self.console.file.flush()  # a pipe or a file sees each line at once
