"""A TCP proxy a test controls: the way to take a server away from keel for real.

Put it between keel and a shared server (PostgreSQL, RabbitMQ) and point keel at
``proxy.address`` (:func:`url_through` rewrites a URL). :meth:`TcpProxy.cut` drops
every open connection and refuses new ones, as a stopped server would;
:meth:`TcpProxy.stall` keeps connections open but lets nothing through, as a network
that silently drops packets would; :meth:`TcpProxy.restore` undoes either, on the
same port. The server behind it is never touched, so other
people's tests using it are not disturbed.

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

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
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
        for reader, writer in ((client_r, server_w), (server_r, client_w)):
            task = asyncio.create_task(self._pump(reader, writer))
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

    def stall(self) -> None:
        """Keep every connection open but forward nothing, until :meth:`restore`."""
        self._flowing.clear()

    async def restore(self) -> None:
        """Accept and forward again, on the same port."""
        self._flowing.set()
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()
