"""What every keel process does the same way: settings, logging, signals, exit codes.

A service's ``main.py`` builds its objects in an ``async`` function that receives the
settings and a :class:`Lifecycle`, and returns when ``lifecycle.stopping`` is set.

SIGHUP re-reads the settings (the environment and the ``--config`` file), applies the
log level, and hands the new settings to every hook the service registered with
:meth:`Lifecycle.on_reload` (clearing cached versions and pins, say); a file that no
longer parses is logged and the old settings stay.

Exit codes: 0 after a clean stop, 2 for a bad setting (one line naming it), 1 when the
service refuses to run — an expected :class:`~shared.exceptions.KeelError`, raised at
start-up or reported later through :meth:`Lifecycle.fail` (a heartbeat refused because
the service is too old), logged as one line that says what to do, without a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import uvloop

from shared.config import Settings, add_config_argument, load_settings
from shared.db.errors import describe, is_transient
from shared.exceptions import ConfigError, KeelError
from shared.logging import set_level, setup_logging
from shared.metrics import Metrics

LOG = logging.getLogger(__name__)

ReloadHook = Callable[[Settings], Coroutine[Any, Any, None]]


class Lifecycle:
    """Signals turned into asyncio events: SIGTERM/SIGINT stop, SIGHUP reloads.

    It also carries what the whole process shares: its metrics, and the settings file it
    re-reads on SIGHUP.
    """

    def __init__(self, *, config_file: Path | None = None, metrics: Metrics | None = None) -> None:
        self.stopping = asyncio.Event()
        self.config_file = config_file
        self.metrics = metrics or Metrics()
        #: Why the process must stop and exit 1, if something refused it while running.
        self.failure: KeelError | None = None
        self._reload_hooks: list[ReloadHook] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def on_reload(self, hook: ReloadHook) -> None:
        """Run ``hook`` with the re-read settings on SIGHUP (e.g. to reset a cache)."""
        self._reload_hooks.append(hook)

    def fail(self, error: KeelError) -> None:
        """Stop, then exit 1 with ``error``'s message (for refusals met while running)."""
        if self.failure is None:
            self.failure = error
        self.stopping.set()

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
        LOG.info("received SIGHUP: re-reading settings and refreshing cached state")
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> None:
        """What SIGHUP does: re-read the settings, then run every reload hook."""
        try:
            settings = load_settings(self.config_file)
        except ConfigError as exc:
            LOG.error("SIGHUP: keeping the current settings: %s", exc.message)
            return
        if set_level(settings.log_level):
            LOG.info("SIGHUP: the log level is now %s", settings.log_level)
        for hook in self._reload_hooks:
            try:
                await hook(settings)
            except Exception:
                LOG.exception("a SIGHUP hook failed")

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


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``KEEL_EVENT_LOOP`` chose (``None``: asyncio's own)."""
    if choice == "uvloop":
        LOG.info("event loop: uvloop")
        return uvloop.new_event_loop
    LOG.info("event loop: asyncio's own (KEEL_EVENT_LOOP=%s)", choice)
    return None


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
        lifecycle = Lifecycle(config_file=args.config)
        lifecycle.install()
        if settings.metrics_bind is not None:
            lifecycle.metrics.serve(settings.metrics_bind)
        await service_main(settings, lifecycle)
        if lifecycle.failure is not None:
            raise lifecycle.failure

    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            runner.run(_run())
    except KeelError as exc:
        LOG.error("%s cannot run: %s", name, exc.message)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    LOG.info("%s stopped", name)
