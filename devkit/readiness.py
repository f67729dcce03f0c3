"""Waiting for things to become true, bounded, and the checks harnesses wait on."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable

from shared.db import services
from shared.db.pool import Connection


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, what: str, timeout: float, interval: float = 0.1
) -> None:
    """Poll ``check`` until it returns True; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        await asyncio.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def api_answers(api_url: str) -> bool:
    """Whether keel-api at ``api_url`` answers its root without a server error."""
    try:
        with urllib.request.urlopen(api_url + "/", timeout=2) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except OSError:
        return False


async def up_services(conn: Connection, down_time: float) -> set[tuple[str, str]]:
    """``(binary, host)`` of every service the database considers up."""
    found = await services.list_services(conn, down_time)
    return {(s.binary, s.host) for s in found if s.is_up}
