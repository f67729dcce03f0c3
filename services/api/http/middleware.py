"""What happens around every request: request id, microversion, access log, last resort.

* The request id comes from ``X-OpenStack-Request-ID`` when the client sends a valid
  ``req-<uuid>``, else a new one; it is returned as ``x-openstack-request-id`` and
  ``x-compute-request-id`` and set in :data:`shared.context.current_request_id` so every
  log line of the request carries it.
* Compute API requests (``/v2.1...``) have their microversion negotiated here; a bad one
  is answered with its fault before any route runs. The chosen version is kept in the
  request state and named in the response headers.
* A compute path with a trailing slash (``/v2.1/servers/``) is answered as the same
  path without it, never redirected; ``/v2.1/`` itself is version discovery. The
  exceptions are the collections whose trailing slash Nova reads as an empty id
  (:data:`EMPTY_ID_PATHS`: ``/v2.1/os-simple-tenant-usage/`` is the usage of a project
  with no id, not the list of all): those answer 404, as Nova does.
* A database that cannot be reached (or a transaction that kept losing races) is
  answered with 503 ``serviceUnavailable`` and ``Retry-After``, logged as one line: the
  pool gets fresh connections by itself, so the client's retry succeeds once PostgreSQL
  is back.
* An error no handler expected is logged with its traceback and answered with a
  ``computeFault`` that names the request id, so the operator can find the log lines.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.http import microversion
from services.api.http.faults import Fault, fault_response
from shared.context import current_request_id, new_request_id
from shared.db.errors import describe, is_transient

LOG = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-OpenStack-Request-ID"
DATABASE_UNAVAILABLE = (
    "keel-api cannot reach its database at the moment. Retry in a few seconds; "
    "if this persists, check that PostgreSQL is running and reachable."
)
COMPUTE_PREFIX = "/v2.1"
_REQUEST_ID = re.compile(r"^req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def request_id_from(headers: Headers) -> str:
    """The client's request id if it is a valid ``req-<uuid>``, else a new one."""
    given = headers.get(REQUEST_ID_HEADER, "").strip().lower()
    return given if _REQUEST_ID.match(given) else new_request_id()


def is_compute_path(path: str) -> bool:
    return path == COMPUTE_PREFIX or path.startswith(COMPUTE_PREFIX + "/")


#: Collection paths at which a trailing slash names an empty id (a 404 in Nova), not the
#: collection itself.
EMPTY_ID_PATHS = frozenset({f"{COMPUTE_PREFIX}/os-simple-tenant-usage"})


def names_an_empty_id(path: str) -> bool:
    return path.endswith("/") and path.rstrip("/") in EMPTY_ID_PATHS


def strip_trailing_slash(scope: Scope) -> None:
    """``/v2.1/servers/`` → ``/v2.1/servers`` in place (``/v2.1/`` stays as it is)."""
    path: str = scope["path"]
    if path.endswith("/") and len(path) > len(COMPUTE_PREFIX) + 1:
        scope["path"] = path.rstrip("/")
        raw: bytes | None = scope.get("raw_path")
        if raw is not None:
            scope["raw_path"] = raw.rstrip(b"/")


@dataclass
class _Exchange:
    """One request being answered, and what the middleware adds to its response."""

    scope: Scope
    receive: Receive
    send: Send
    request_id: str
    extra_headers: list[tuple[str, str]] = field(default_factory=list)
    status: int = 0

    async def send_with_headers(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = MutableHeaders(scope=message)
            for name, value in self.extra_headers:
                headers.append(name, value)
        await self.send(message)

    async def reply(self, code: int, message: str) -> None:
        """Answer with a fault (the extra headers included)."""
        await fault_response(code, message)(self.scope, self.receive, self.send_with_headers)


class ApiMiddleware:
    """Pure ASGI middleware, so the request id context covers the whole request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        exchange = _Exchange(scope, receive, send, request_id_from(headers))
        scope.setdefault("state", {})["request_id"] = exchange.request_id
        exchange.extra_headers += [
            ("x-openstack-request-id", exchange.request_id),
            ("x-compute-request-id", exchange.request_id),
        ]
        token = current_request_id.set(exchange.request_id)
        started = time.monotonic()
        try:
            await self._call(exchange, headers)
        finally:
            elapsed = time.monotonic() - started
            LOG.info(
                "%s %s status %d in %.3fs", scope["method"], scope["path"], exchange.status, elapsed
            )
            current_request_id.reset(token)

    @staticmethod
    def _negotiate(exchange: _Exchange, headers: Headers) -> Fault | None:
        """Choose the request's microversion; the fault to answer with if it is bad."""
        try:
            asked = microversion.requested(
                headers.getlist(microversion.HEADER),
                headers.getlist(microversion.LEGACY_HEADER),
            )
            version = microversion.negotiate(asked)
        except Fault as fault:
            return fault
        exchange.scope["state"]["api_version"] = version
        exchange.extra_headers += microversion.response_headers(version)
        return None

    async def _call(self, exchange: _Exchange, headers: Headers) -> None:
        scope = exchange.scope
        try:
            fault = None
            if is_compute_path(scope["path"]):
                empty_id = names_an_empty_id(scope["path"])
                strip_trailing_slash(scope)
                fault = self._negotiate(exchange, headers)
                if fault is None and empty_id:
                    LOG.info("%s: an empty id after the slash, answered 404", scope["path"] + "/")
                    await exchange.reply(404, "The resource could not be found: an empty id.")
                    return
            if fault is not None:
                await exchange.reply(fault.code, fault.message)
                return
            await self.app(scope, exchange.receive, exchange.send_with_headers)
        except Exception as exc:
            if exchange.status:
                LOG.exception("error after answering %s %s", scope["method"], scope["path"])
                raise
            if is_transient(exc):
                LOG.warning(
                    "cannot answer %s %s: the database is unavailable (%s)",
                    scope["method"],
                    scope["path"],
                    describe(exc),
                )
                await exchange.reply(503, DATABASE_UNAVAILABLE)
                return
            LOG.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            message = (
                "Unexpected API Error. The keel-api log has the details "
                f"under request id {exchange.request_id}."
            )
            await exchange.reply(500, message)
