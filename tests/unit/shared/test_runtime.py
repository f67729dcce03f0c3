"""Periodic work that survives failures, and says so in one line."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared.exceptions import KeelError
from shared.runtime import Lifecycle, repeat


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
