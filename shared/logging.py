"""Structured logs: JSON for machines, one readable line for terminals.

Every record carries the service, the host and the request id of the work in progress
(from :data:`shared.context.current_request_id`). Code adds more fields with
``extra={"rpc_method": ..., "rpc_version": ...}``; the names in ``_EXTRA_FIELDS`` are
the ones the formatters print.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

from shared.context import current_request_id
from shared.db.errors import describe, is_transient

_EXTRA_FIELDS = ("rpc_method", "rpc_version", "instance_uuid", "decision")
#: Loggers of libraries whose connection failures are folded into one line.
_DRIVER_LOGGERS = ("asyncpg", "asyncio")


class _ContextFilter(logging.Filter):
    def __init__(self, service: str, host: str) -> None:
        super().__init__()
        self.service = service
        self.host = host

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.host = self.host
        record.request_id = current_request_id.get()
        return True


class _FoldDriverTracebacks(logging.Filter):
    """One line, not a traceback, when the database driver reports an outage.

    asyncpg's pool logs every failed attempt to restore its connections with the
    traceback of a refused connection, and asyncio reports connections lost under a
    driver the same way; during an outage that is noise that hides the lines that
    matter. The error's class and message are kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if record.name.startswith(_DRIVER_LOGGERS) and error is not None and is_transient(error):
            record.msg = f"{record.getMessage()} ({describe(error)})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "service": getattr(record, "service", None),
            "host": getattr(record, "host", None),
            "request_id": getattr(record, "request_id", None),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _EXTRA_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        request_id = getattr(record, "request_id", None)
        parts = [stamp, f"{record.levelname:<7}", str(getattr(record, "service", "-"))]
        if request_id:
            parts.append(f"[{request_id}]")
        parts.append(f"{record.name}: {record.getMessage()}")
        extras = [f"{n}={getattr(record, n)}" for n in _EXTRA_FIELDS if hasattr(record, n)]
        if extras:
            parts.append("(" + " ".join(extras) + ")")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(
    service: str,
    host: str,
    level: str = "INFO",
    fmt: Literal["auto", "json", "text"] = "auto",
) -> None:
    """Configure the root logger for one process. Called once, from ``main``."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    handler.addFilter(_ContextFilter(service, host))
    handler.addFilter(_FoldDriverTracebacks())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)


def set_level(level: str) -> bool:
    """Log at ``level`` from now on (also on SIGHUP); True if that is a change.

    The chattiest libraries stay at WARNING or above.
    """
    root = logging.getLogger()
    changed = logging.getLevelName(root.level) != level
    root.setLevel(level)
    for noisy in ("aiormq", "aio_pika", "asyncio", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    return changed
