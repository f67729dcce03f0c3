"""What every keel process does the same way: settings, logging, signals, exit codes.

A service's ``main.py`` builds its objects in an ``async`` function that receives the
settings and a :class:`Lifecycle`, and returns when ``lifecycle.stopping`` is set.

Exit codes: 0 after a clean stop, 2 for a bad setting (one line naming it), 1 when the
service refuses to run (an expected :class:`~shared.exceptions.KeelError`, logged as one
line that says what to do, without a traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from shared.config import Settings, add_config_argument, load_settings
from shared.db.errors import describe, is_transient
from shared.exceptions import ConfigError, KeelError
from shared.logging import setup_logging

LOG = logging.getLogger(__name__)

ReloadHook = Callable[[], Coroutine[Any, Any, None]]


class Lifecycle:
    """Signals turned into asyncio events: SIGTERM/SIGINT stop, SIGHUP reloads."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self._reload_hooks: list[ReloadHook] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def on_reload(self, hook: ReloadHook) -> None:
        """Run ``hook`` on SIGHUP (e.g. to reset a cache)."""
        self._reload_hooks.append(hook)

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._reload)

    def _stop(self, sig: signal.Signals) -> None:
        if not self.stopping.is_set():
            LOG.info("received %s: stopping", sig.name)
        self.stopping.set()

    def _reload(self) -> None:
        LOG.info("received SIGHUP: refreshing cached state")
        for hook in self._reload_hooks:
            task = asyncio.get_running_loop().create_task(hook())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; True if the process is stopping."""
        try:
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        except TimeoutError:
            return False
        return True


async def repeat(
    what: str, action: Callable[[], Awaitable[object]], interval: float, lifecycle: Lifecycle
) -> None:
    """Run ``action`` every ``interval`` seconds until stopping; a failure is logged, not fatal.

    A database that cannot be reached is logged as one line per attempt, without a
    traceback, and the first success afterwards says that it works again.
    """
    failures = 0
    while not lifecycle.stopping.is_set():
        try:
            await action()
        except KeelError as exc:
            failures += 1
            LOG.warning("%s failed: %s", what, exc.message)
        except Exception as exc:
            failures += 1
            if is_transient(exc):
                LOG.warning("%s failed: the database is unavailable (%s)", what, describe(exc))
            else:
                LOG.exception("%s failed", what)
        else:
            if failures:
                LOG.info("%s works again after %d failed attempt(s)", what, failures)
            failures = 0
        if await lifecycle.sleep(interval):
            return


ServiceMain = Callable[[Settings, Lifecycle], Awaitable[None]]


def run(
    name: str, service_main: ServiceMain, argv: Sequence[str] | None = None, description: str = ""
) -> None:
    """Parse ``--config``, load settings, set up logging, run ``service_main``, exit."""
    parser = argparse.ArgumentParser(prog=name, description=description)
    add_config_argument(parser)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"{name}: {exc.message}", file=sys.stderr)
        sys.exit(2)
    setup_logging(name, settings.host, settings.log_level, settings.log_format)

    async def _run() -> None:
        lifecycle = Lifecycle()
        lifecycle.install()
        await service_main(settings, lifecycle)

    try:
        asyncio.run(_run())
    except KeelError as exc:
        LOG.error("%s cannot run: %s", name, exc.message)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    LOG.info("%s stopped", name)
