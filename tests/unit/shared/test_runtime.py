"""Periodic work that survives failures, and says so in one line."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
import uvloop

from shared.config import Settings
from shared.exceptions import KeelError
from shared.runtime import Lifecycle, loop_factory, repeat


async def _run(outcomes: list[BaseException | None]) -> int:
    """Run ``repeat`` over ``outcomes`` (None is a success); return how many ran."""
    lifecycle = Lifecycle()
    ran = 0

    async def action() -> None:
        nonlocal ran
        outcome = outcomes[ran]
        ran += 1
        if ran == len(outcomes):
            lifecycle.stopping.set()
        if outcome is not None:
            raise outcome

    await asyncio.wait_for(repeat("heartbeat", action, 0.001, lifecycle), 5)
    return ran


async def test_a_database_outage_is_one_line_per_attempt_then_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="shared.runtime")
    refused = ConnectionRefusedError(111, "Connect call failed")
    assert await _run([refused, refused, None, None]) == 4
    records = [r for r in caplog.records if r.name == "shared.runtime"]
    messages = [r.getMessage() for r in records]
    assert messages == [
        "heartbeat failed: the database is unavailable "
        "(ConnectionRefusedError: [Errno 111] Connect call failed)",
    ] * 2 + ["heartbeat works again after 2 failed attempt(s)"]
    assert all(r.exc_info is None for r in records)


async def test_business_errors_are_one_line_and_bugs_keep_their_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await _run([KeelError("conductor busy"), RuntimeError("bug"), None]) == 3
    records = [r for r in caplog.records if r.name == "shared.runtime"]
    assert records[0].getMessage() == "heartbeat failed: conductor busy"
    assert records[0].exc_info is None
    assert records[1].exc_info is not None


async def test_sighup_rereads_the_config_file_and_runs_the_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in [n for n in os.environ if n.startswith("KEEL_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "keel.toml"
    config.write_text('[upgrade_levels]\ncompute = "auto"\n')
    lifecycle = Lifecycle(config_file=config)
    seen: list[Settings] = []

    async def hook(settings: Settings) -> None:
        seen.append(settings)

    lifecycle.on_reload(hook)
    config.write_text('log_level = "DEBUG"\n[upgrade_levels]\ncompute = "arbor"\n')
    root = logging.getLogger()
    level = root.level
    try:
        await lifecycle.reload()
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(level)
    assert [s.upgrade_levels.compute for s in seen] == ["arbor"]

    config.write_text("this is not toml = [")
    caplog.set_level(logging.ERROR, logger="shared.runtime")
    await lifecycle.reload()
    assert len(seen) == 1
    assert "SIGHUP: keeping the current settings" in caplog.text


async def test_a_refusal_while_running_stops_the_process_with_it() -> None:
    lifecycle = Lifecycle()
    lifecycle.fail(KeelError("too old"))
    lifecycle.fail(KeelError("later"))
    assert lifecycle.stopping.is_set()
    assert lifecycle.failure is not None
    assert lifecycle.failure.message == "too old"


def test_services_run_on_asyncios_loop_unless_told_to_use_uvloop() -> None:
    assert loop_factory(Settings().event_loop) is None
    factory = loop_factory("uvloop")
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
