"""Guests' requests to the metadata service, passed on signed: the host side of 169.254.169.254.

In user-mode networking each guest's connections to ``169.254.169.254:80`` reach a Unix
socket of its own, ``<state dir>/md/<first 12 hex digits of its uuid>.sock``, which
QEMU connects to (and connects to again within a second when this agent restarts). The
socket a request arrives on is what says which guest sent it: nothing the guest sends
is trusted. Each request is passed to the metadata service (``KEEL_METADATA__URL``) with
the guest's id and its HMAC (``X-Instance-ID``, ``X-Instance-ID-Signature``), headers of
those names the guest sent dropped, and the answer passed back.

QEMU carries all of one guest's connections to 169.254.169.254 over its one connection
to the socket, so requests are read and answered one after another, each framed by its
headers (and ``Content-Length``); a guest that sends two requests at once on two
connections may see the answers crossed (cloud-init and the test guest ask one at a
time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from uuid import UUID

from shared.guest_metadata import signature

LOG = logging.getLogger(__name__)

SOCKET_DIR = "md"
#: The longest request head (request line and headers) and body a guest may send.
MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
#: Seconds the metadata service may take to answer one request.
FORWARD_TIMEOUT = 30.0
#: Headers a guest may not send: the proxy's own, and those of its connection.
_DROPPED = frozenset({"x-instance-id", "x-instance-id-signature", "x-tenant-id",
                      "x-forwarded-for", "host", "connection", "keep-alive"})  # fmt: skip
#: The longest path a Unix socket may have (``sun_path``, with its terminating zero).
MAX_SOCKET_PATH = 107


@dataclass
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the stream; ``None`` when it ended between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise ValueError("the stream ended inside a request") from None
        return None
    except asyncio.LimitOverrunError:
        raise ValueError(f"a request head longer than {MAX_HEAD} bytes") from None
    line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _version = line.split(" ", 2)
    request = Request(method=method, target=target)
    length = 0
    for header in lines:
        if not header:
            continue
        name, _, value = header.partition(":")
        name, value = name.strip(), value.strip()
        if name.lower() == "content-length":
            length = int(value)
        if name.lower() not in _DROPPED and name.lower() != "content-length":
            request.headers.append((name, value))
    if not 0 <= length <= MAX_BODY:
        raise ValueError(f"a request body of {length} bytes")
    request.body = await reader.readexactly(length)
    return request


def _error(status: str, text: str) -> bytes:
    body = text.encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


class MetadataRelay:
    """The agent's side of its guests' metadata forwards: one Unix socket per guest."""

    def __init__(self, state_dir: Path, url: str, secret: str) -> None:
        self.socket_dir = state_dir / SOCKET_DIR
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._secret = secret
        self._servers: dict[UUID, asyncio.Server] = {}

    def socket_path(self, instance_uuid: UUID) -> Path:
        return self.socket_dir / f"{instance_uuid.hex[:12]}.sock"

    async def serve(self, instance_uuid: UUID) -> Path:
        """Listen on the guest's socket (again, after a restart); its path."""
        path = self.socket_path(instance_uuid)
        if instance_uuid in self._servers:
            return path
        if len(str(path)) > MAX_SOCKET_PATH:
            raise OSError(f"the metadata socket path {path} is too long for a Unix socket")
        self.socket_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by an earlier run of the agent

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._relay(instance_uuid, reader, writer)

        server = await asyncio.start_unix_server(relay, path=str(path), limit=MAX_HEAD)
        os.chmod(path, 0o660)
        self._servers[instance_uuid] = server
        return path

    async def stop(self, instance_uuid: UUID) -> None:
        server = self._servers.pop(instance_uuid, None)
        if server is not None:
            server.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path(instance_uuid).unlink()

    def serving(self) -> set[UUID]:
        return set(self._servers)

    async def _relay(
        self, instance_uuid: UUID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        extra = {"instance_uuid": str(instance_uuid)}
        LOG.info("guest %s's metadata forward is connected", instance_uuid, extra=extra)
        try:
            while (request := await read_request(reader)) is not None:
                answer = await self._forward(instance_uuid, request)
                LOG.debug(
                    "guest %s: %s %s: %s",
                    instance_uuid,
                    request.method,
                    request.target,
                    answer.split(b"\r\n", 1)[0].decode("latin-1"),
                    extra=extra,
                )
                writer.write(answer)
                await writer.drain()
        except asyncio.CancelledError:
            return  # the agent is stopping: QEMU connects again to the next one
        except (ValueError, ConnectionError) as exc:
            LOG.warning(
                "guest %s sent a metadata request that cannot be read: %s",
                instance_uuid,
                exc,
                extra={"instance_uuid": str(instance_uuid)},
            )
        finally:
            writer.close()

    async def _forward(self, instance_uuid: UUID, request: Request) -> bytes:
        instance_id = str(instance_uuid)
        headers = [
            (f"{request.method} {request.target} HTTP/1.1"),
            f"Host: {self._host}:{self._port}",
            "Connection: close",
            f"Content-Length: {len(request.body)}",
            f"X-Instance-ID: {instance_id}",
            f"X-Instance-ID-Signature: {signature(self._secret, instance_id)}",
            *(f"{name}: {value}" for name, value in request.headers),
        ]
        try:
            async with asyncio.timeout(FORWARD_TIMEOUT):
                upstream_reader, upstream = await asyncio.open_connection(self._host, self._port)
                try:
                    upstream.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1"))
                    upstream.write(request.body)
                    await upstream.drain()
                    return await upstream_reader.read()
                finally:
                    upstream.close()
        except (OSError, TimeoutError) as exc:
            LOG.warning(
                "the metadata service at %s:%d did not answer guest %s: %s",
                self._host,
                self._port,
                instance_uuid,
                exc,
                extra={"instance_uuid": instance_id},
            )
            return _error("502 Bad Gateway", "The metadata service is not available.\n")
