"""A TCP proxy a test controls: the way to take a server away from keel for real.

Put it between keel and a shared server (PostgreSQL, RabbitMQ) and point keel at
``proxy.address`` (:func:`url_through` rewrites a URL). :meth:`TcpProxy.cut` drops
every open connection and refuses new ones, as a stopped server would;
:meth:`TcpProxy.stall` keeps connections open but lets nothing through, as a network
that silently drops packets would; :meth:`TcpProxy.cut_after` lets a request through
and then cuts before its answer can come back, as a connection lost at the worst moment
would; :meth:`TcpProxy.restore` undoes any of them, on the same port. The server
behind it is never touched, so other people's tests using it are not disturbed.

The proxy runs in the test's event loop: while a test waits (``await``), it forwards.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit, urlunsplit


def url_through(url: str, address: str) -> str:
    """``url`` with its host and port replaced by ``address`` (credentials kept)."""
    parts = urlsplit(url)
    credentials, _, _ = parts.netloc.rpartition("@")
    netloc = f"{credentials}@{address}" if credentials else address
    return urlunsplit(parts._replace(netloc=netloc))


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        #: Connections accepted since the proxy started (a test can see keel reconnect).
        self.accepted = 0
        #: Set by :meth:`cut_after`: the bytes whose forwarding triggers the cut.
        self._cut_after: bytes | None = None
        self._answers_dropped = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._server is None

    async def start(self) -> None:
        """Listen (on a free port the first time, on the same port after a cut)."""
        self._server = await asyncio.start_server(
            self._connect, self.host, self.port, reuse_address=True
        )
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                await self._flowing.wait()
                if not upstream and self._answers_dropped:
                    continue
                writer.write(chunk)
                await writer.drain()
                if upstream and self._cut_after is not None and self._cut_after in chunk:
                    self._cut_after = None
                    self._answers_dropped = True
                    # Give the server the time to act on it, then cut.
                    asyncio.get_running_loop().call_later(
                        0.3, lambda: asyncio.ensure_future(self.cut())
                    )
        except OSError:
            pass
        finally:
            writer.close()
            self._writers.discard(writer)

    async def _connect(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        if self._server is None:
            client_w.transport.abort()
            return
        await self._flowing.wait()
        if self._server is None:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self.accepted += 1
        self._writers |= {client_w, server_w}
        for reader, writer, upstream in ((client_r, server_w, True), (server_r, client_w, False)):
            task = asyncio.create_task(self._pump(reader, writer, upstream=upstream))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def cut(self) -> None:
        """Close every connection at once and refuse new ones until :meth:`restore`."""
        self._flowing.set()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    def cut_after(self, marker: bytes) -> None:
        """Forward the next client chunk holding ``marker``, drop every answer from then
        on, and cut shortly after (until :meth:`restore`)."""
        self._cut_after = marker

    def stall(self) -> None:
        """Keep every connection open but forward nothing, until :meth:`restore`."""
        self._flowing.clear()

    async def restore(self) -> None:
        """Accept and forward again, on the same port."""
        self._flowing.set()
        self._cut_after, self._answers_dropped = None, False
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()
