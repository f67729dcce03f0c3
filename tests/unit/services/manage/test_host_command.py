"""``keel-manage host``: what is refused before the database is asked, and how a task is
drawn (the rich table and the summary line) when the output is not a terminal."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from rich.console import Console

from services.manage.host_task_view import items_table, outcome, summary
from services.manage.main import run
from shared.objects.host_task import HostTask, HostTaskItem, TaskCounts


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["host", "drain", "h1", "--parallel", "0"], "parallel must be"),
        (["host", "drain", "h1", "--cold-fallback", "--parallel", "101"], "parallel must be"),
        (["host", "evacuate", "h1", "--deadline", "0"], "deadline must be between"),
    ],
)
def test_bad_bounds_exit_2_before_the_database(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database nobody answers at: the command must refuse before it tries.
    monkeypatch.setenv("KEEL_DATABASE_URL", "postgresql://keel@127.0.0.1:1/keel")
    assert run(argv) == 2
    assert says in capsys.readouterr().err


def task(status: str, message: str | None) -> HostTask:
    now = datetime.now(UTC)
    return HostTask(
        id=7, uuid=uuid.uuid4(), kind="drain", service_id=1, host="h1", status=status,
        parallel=2, cold_fallback=True, deadline=now, user_id="keel-manage", project_id=None,
        message=message, created_at=now, updated_at=now, ended_at=None, deadline_in=42.0,
    )  # fmt: skip


def item(name: str, status: str, dest: str | None, message: str | None) -> HostTaskItem:
    now = datetime.now(UTC)
    return HostTaskItem(
        id=1, task_id=7, instance_uuid=uuid.uuid4(), name=name, status=status,
        migration_uuid=None, dest=dest, message=message, created_at=now, updated_at=now,
    )  # fmt: skip


def test_the_table_and_the_lines_say_each_servers_result() -> None:
    console = Console(width=160, record=True)
    items = [
        item("web-2", "failed", None, "No valid host was found."),
        item("web-1", "moved", "h2", "moved by cold migration"),
    ]
    console.print(items_table(task("failed", "1 of 2 server(s) could not be moved"), items))
    console.print(outcome(task("failed", "1 of 2 server(s) could not be moved")))
    text = console.export_text()

    lines = text.splitlines()
    web1 = next(n for n, line in enumerate(lines) if "web-1" in line)
    web2 = next(n for n, line in enumerate(lines) if "web-2" in line)
    assert web1 < web2, "sorted by name"
    assert "moved" in lines[web1]
    assert "h2" in lines[web1]
    assert "No valid host was found." in lines[web2]
    assert "host task 7: drain of h1: failed: 1 of 2 server(s) could not be moved" in text
    counts = TaskCounts(moved=1, moving=2, pending=3)
    assert summary(task("running", None), counts) == (
        "host task 7: drain of h1 [running]: 1 moved, 2 moving, 3 pending, 0 failed, "
        "0 skipped of 6; deadline in 42s"
    )
