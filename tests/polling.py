"""Waiting for something to become true, bounded: how tests wait instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, what: str, timeout: float, interval: float = 0.1
) -> None:
    """Poll ``check`` until it returns True; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        await asyncio.sleep(interval)
