"""The agent's connection to libvirtd: blocking calls off the event loop, reconnected.

Every libvirt call blocks (it is a round trip to libvirtd, and some wait for QEMU), so
each runs in this connection's own small thread pool, never on the event loop and never
in the default pool that other file work shares. When libvirtd restarts, the connection
is found dead on the next call that fails; it is opened again and the call made once
more, so the agent carries on without a restart (each log line says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shared.exceptions import BuildFailed

LOG = logging.getLogger(__name__)

T = TypeVar("T")
#: Threads making libvirt calls at once (libvirt connections are thread-safe).
WORKERS = 4


def _quiet(_context: object, _error: object) -> None:
    """libvirt's errors are raised as exceptions and logged by keel, not printed."""


def load_libvirt() -> Any:
    """The libvirt binding; a clear error when it is not installed."""
    try:
        import libvirt  # noqa: PLC0415 - optional: only the libvirt driver needs it
    except ImportError:
        raise BuildFailed(
            "the libvirt driver needs the libvirt-python binding: install keel with its "
            "libvirt extra (pip install 'keel[libvirt]'; it builds against libvirt-dev "
            "and pkg-config)"
        ) from None
    libvirt.registerErrorHandler(_quiet, None)
    return libvirt


class LibvirtConnection:
    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.libvirt = load_libvirt()
        self._conn: Any = None
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="libvirt")

    def _connection(self) -> Any:
        with self._lock:
            if self._conn is None:
                try:
                    self._conn = self.libvirt.open(self.uri)
                except self.libvirt.libvirtError as exc:
                    raise BuildFailed(
                        f"cannot connect to libvirt at {self.uri}: {exc.get_error_message()}"
                    ) from None
                LOG.info("connected to libvirt at %s", self.uri)
            return self._conn

    def _drop(self, dead: Any) -> bool:
        """Forget ``dead`` if it is still the current connection and is not alive."""
        with self._lock:
            if self._conn is not dead:
                return True
            try:
                alive = bool(dead.isAlive())
            except self.libvirt.libvirtError:
                alive = False
            if alive:
                return False
            self._conn = None
        LOG.warning("the connection to libvirt at %s was lost; connecting again", self.uri)
        return True

    def _call(self, operation: Callable[[Any], T]) -> T:
        conn = self._connection()
        try:
            return operation(conn)
        except self.libvirt.libvirtError:
            if not self._drop(conn):
                raise
        return operation(self._connection())

    async def run(self, operation: Callable[[Any], T]) -> T:
        """Run ``operation(connection)`` in the libvirt threads; reconnect once if lost."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, operation)

    def error_code(self, exc: BaseException) -> int | None:
        if isinstance(exc, self.libvirt.libvirtError):
            code: int = exc.get_error_code()
            return code
        return None

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(self.libvirt.libvirtError):
                conn.close()
        self._executor.shutdown(wait=False)
