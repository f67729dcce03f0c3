"""Log lines: a driver's connection failures are folded into one line."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from shared.logging import setup_logging


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    captured = io.StringIO()
    monkeypatch.setattr("sys.stderr", captured)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    setup_logging("keel-test", "host1", "INFO", "text")
    yield captured
    root.handlers[:] = handlers
    root.setLevel(level)


def _log(name: str, error: BaseException) -> None:
    try:
        raise error
    except BaseException:
        logging.getLogger(name).warning("Failed to restore the pool connection", exc_info=True)


def test_a_driver_outage_is_one_line(stream: io.StringIO) -> None:
    _log("asyncpg.pool", ConnectionRefusedError(111, "Connect call failed"))
    text = stream.getvalue()
    assert "Traceback" not in text
    assert text.count("\n") == 1
    assert "(ConnectionRefusedError: [Errno 111] Connect call failed)" in text


def test_other_tracebacks_are_kept(stream: io.StringIO) -> None:
    _log("asyncpg.pool", RuntimeError("a bug"))
    _log("services.api", ConnectionRefusedError(111, "refused"))
    assert stream.getvalue().count("Traceback") == 2
