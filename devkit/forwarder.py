"""A TCP forwarder that runs in a thread of its own: what a partitioned agent reaches.

:class:`Forwarder` owns an event loop in a background thread, so it keeps forwarding
while the harness's own loop blocks (a ``subprocess.run`` of the ``openstack`` client,
say): a stalled harness must never look like a network fault to the agents. Each
:class:`Listener` accepts on one address and forwards every connection to one target.
The harness can, per listener:

* :meth:`Listener.cut` — close every connection at once and refuse new ones (as a
  broker that went away would), until :meth:`Listener.heal`;
* :meth:`Listener.set_delay` — hold every chunk for that many seconds before passing it
  on, in each direction, keeping their order (what ``tc netem delay`` does, for machines
  without ``sch_netem``).

Every method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

LOG = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a call into the forwarder's thread may take.
CALL_TIMEOUT = 10.0


class Forwarder:
    """An event loop in a daemon thread, hosting :class:`Listener` objects."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="keel-forwarder", daemon=True)
        self._thread.start()
        self._listeners: list[Listener] = []

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` in the forwarder's loop and wait for its result."""
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(work, self._loop)
        return future.result(CALL_TIMEOUT)

    def listen(self, host: str, target: tuple[str, int], port: int = 0) -> Listener:
        """A new listener on ``host`` (a free port unless given) forwarding to ``target``."""
        listener = Listener(self, host, target, port)
        self.call(listener.start())
        self._listeners.append(listener)
        return listener

    def close(self) -> None:
        """Close every listener and stop the thread."""
        for listener in self._listeners:
            try:
                self.call(listener.close())
            except Exception:
                LOG.exception("could not close the forwarder on %s", listener.address)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT)


class Listener:
    """One address forwarded to one target; see the module's text."""

    def __init__(self, owner: Forwarder, host: str, target: tuple[str, int], port: int) -> None:
        self._owner = owner
        self.host = host
        self.port = port
        self.target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.delay = 0.0
        #: Connections accepted so far (a test can see an agent reconnect).
        self.accepted = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._server is None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connect, self.host, self.port, reuse_address=True
        )
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy ``source`` to ``sink``, each chunk no sooner than ``delay`` after it came;
        at the end of ``source``, what is held is passed on before ``sink`` closes."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, chunk = await held.get()
                if not chunk:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                sink.write(chunk)
                await sink.drain()

        releasing = asyncio.create_task(release())
        try:
            while not releasing.done() and (chunk := await source.read(65536)):
                # Every chunk goes through the queue, in order, delayed or not.
                held.put_nowait((time.monotonic() + self.delay, chunk))
            held.put_nowait((0.0, b""))
            await releasing
        except OSError:
            pass
        finally:
            releasing.cancel()
            sink.close()
            self._writers.discard(sink)

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _heal(self) -> None:
        self.delay = 0.0
        if self._server is None:
            await self.start()

    async def _set_delay(self, seconds: float) -> None:
        self.delay = max(0.0, seconds)

    async def close(self) -> None:
        await self._cut()

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`heal`."""
        self._owner.call(self._cut())

    def heal(self) -> None:
        """Accept and forward again, on the same port, without delay."""
        self._owner.call(self._heal())

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before passing it on (0: none)."""
        self._owner.call(self._set_delay(seconds))
