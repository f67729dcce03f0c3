"""Security headers on every answer under ``/ops`` (errors included).

* ``Content-Security-Policy``: scripts, styles and requests only to keel-api itself, no
  inline script, no framing, forms posted only here;
* ``X-Frame-Options: DENY`` for older browsers, ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: same-origin``;
* ``Cache-Control: no-store`` unless the route chose otherwise (the static files), so no
  cache keeps a page or an answer with the fleet's data.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/ops"
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_FIXED = (
    ("Content-Security-Policy", POLICY),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
)


def is_ops_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class OpsHeaders:
    """Pure ASGI middleware adding the headers above to ``/ops`` answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_ops_path(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _FIXED:
                    headers[name] = value
                if "cache-control" not in headers:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_secured)
