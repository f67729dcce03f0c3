"""A TCP proxy a test can cut: real network faults without touching shared servers.

Point a keel process (or a transport, or a pool) at the proxy instead of RabbitMQ or
PostgreSQL. :meth:`TcpProxy.cut` aborts every connection through it at once, as a
network failure or a server crash would; with :meth:`TcpProxy.refuse` new connections
are refused until :meth:`TcpProxy.restore`. Other tests sharing the server never notice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

_CHUNK = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.refusing = False
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, upstream_writer}
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(_CHUNK):
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.transport.abort()
            self._writers.discard(sink)

    def cut(self) -> None:
        """Abort every connection through the proxy now."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def refuse(self) -> None:
        """Cut every connection and refuse new ones until :meth:`restore`."""
        self.refusing = True
        self.cut()

    def restore(self) -> None:
        self.refusing = False

    async def close(self) -> None:
        self.refuse()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._pipes):
            task.cancel()
        for task in list(self._pipes):
            with contextlib.suppress(asyncio.CancelledError):
                await task


@asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(target_host, target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
