"""The agent's metadata relay: a guest's socket in, signed requests out (loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.compute.virt.libvirt.metadata_relay import MetadataRelay
from shared.guest_metadata import signature

pytestmark = pytest.mark.functional

SECRET = "relay-secret-0123456789"


class Upstream:
    """A stand-in metadata service on 127.0.0.1: records each request's head, answers it."""

    def __init__(self) -> None:
        self.heads: list[str] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        self.heads.append(head)
        body = f"answer {len(self.heads)}".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    stand_in = Upstream()
    server = await asyncio.start_server(stand_in.handle, "127.0.0.1", 0)
    stand_in.port = server.sockets[0].getsockname()[1]
    yield stand_in
    server.close()


def header(head: str, name: str) -> list[str]:
    return [
        line.split(":", 1)[1].strip()
        for line in head.split("\r\n")
        if line.lower().startswith(name.lower() + ":")
    ]


async def test_requests_are_signed_as_the_guest_whose_socket_they_came_in_on(
    upstream: Upstream, tmp_path: Path
) -> None:
    relay = MetadataRelay(tmp_path, f"http://127.0.0.1:{upstream.port}", SECRET)
    guest, other = uuid.uuid4(), uuid.uuid4()
    path = await relay.serve(guest)
    reader, writer = await asyncio.open_unix_connection(str(path))

    # Two requests one after the other on one stream (how QEMU carries a guest's
    # connections), the first claiming to be another guest.
    writer.write(
        f"GET /openstack/latest/meta_data.json HTTP/1.1\r\nHost: 169.254.169.254\r\n"
        f"X-Instance-ID: {other}\r\nX-Instance-ID-Signature: {signature(SECRET, str(other))}\r\n"
        f"X-Forwarded-For: 10.0.0.9\r\n\r\n"
        "GET /latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n".encode()
    )
    await writer.drain()
    answers = await asyncio.wait_for(reader.readuntil(b"answer 2"), 10)
    writer.close()
    await relay.stop(guest)

    first, second = upstream.heads
    assert first.startswith("GET /openstack/latest/meta_data.json HTTP/1.1")
    assert second.startswith("GET /latest/meta-data/ HTTP/1.1")
    for head in (first, second):
        assert header(head, "X-Instance-ID") == [str(guest)]
        assert header(head, "X-Instance-ID-Signature") == [signature(SECRET, str(guest))]
        assert header(head, "X-Forwarded-For") == []
    assert b"answer 1" in answers
    assert not path.exists()


async def test_without_the_metadata_service_the_guest_gets_a_502(tmp_path: Path) -> None:
    with socket_port() as port:  # nothing listens there
        relay = MetadataRelay(tmp_path, f"http://127.0.0.1:{port}", SECRET)
    path = await relay.serve(uuid.uuid4())
    reader, writer = await asyncio.open_unix_connection(str(path))

    writer.write(b"GET / HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 40)
    writer.close()

    assert status.startswith(b"HTTP/1.1 502")


def socket_port() -> contextlib.AbstractContextManager[int]:
    """A port on 127.0.0.1 that was free a moment ago."""

    @contextlib.contextmanager
    def closed() -> Iterator[int]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        yield port

    return closed()
