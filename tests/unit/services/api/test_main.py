"""The composition root's own behaviour: uvicorn must leave the process signals alone
and keep idle connections open longer than clients wait between polls."""

from __future__ import annotations

import asyncio
import signal

import uvicorn
from fastapi import FastAPI

from services.api.main import ApiServer, listen, serve_until_stopped, server_config
from shared.runtime import Lifecycle


def test_uvicorn_installs_no_signal_handlers() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = ApiServer(uvicorn.Config(FastAPI(), log_config=None))
    with server.capture_signals():
        during = {sig: signal.getsignal(sig) for sig in before}
    assert during == before
    assert {sig: signal.getsignal(sig) for sig in before} == before


async def test_a_connection_idle_for_a_clients_poll_interval_is_still_open() -> None:
    """``openstack server create --wait`` reuses its connection every 5 s: the server
    must not be closing it at that moment (uvicorn's own default is exactly 5 s)."""
    app = FastAPI()

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"ok": "yes"}

    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.listen()  # connections wait in the backlog until uvicorn accepts them
    lifecycle = Lifecycle()
    serving = asyncio.create_task(
        serve_until_stopped(ApiServer(server_config(app)), sock, lifecycle)
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        answers = []
        for pause in (6, 0):  # past a 5 s poll, with a second to spare
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            answers.append(head.split(b"\r\n")[0] + await reader.readexactly(length))
            await asyncio.sleep(pause)
        writer.close()
    finally:
        lifecycle.stopping.set()
        await serving
        sock.close()
    assert answers == [b'HTTP/1.1 200 OK{"ok":"yes"}'] * 2
