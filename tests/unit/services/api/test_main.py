"""The composition root's own behaviour: uvicorn must leave the process signals alone."""

from __future__ import annotations

import signal

import uvicorn
from fastapi import FastAPI

from services.api.main import ApiServer


def test_uvicorn_installs_no_signal_handlers() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = ApiServer(uvicorn.Config(FastAPI(), log_config=None))
    with server.capture_signals():
        during = {sig: signal.getsignal(sig) for sig in before}
    assert during == before
    assert {sig: signal.getsignal(sig) for sig in before} == before
