"""Managing RabbitMQ users through its management HTTP API (the ``rabbitmq_management``
plugin), for ``keel-manage agent``.

The API is reached at ``KEEL_RPC__MANAGEMENT_URL``, by default port 15672 of the (first)
host in ``KEEL_TRANSPORT_URL``, as that URL's user (it must have the ``administrator`` tag); the
virtual host is the one in ``KEEL_TRANSPORT_URL``. Every failure becomes one
:class:`~shared.exceptions.KeelError` that says what to do; passwords never appear in it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from shared.config import Settings
from shared.exceptions import KeelError
from shared.rpc.agent_users import Permissions
from shared.rpc.broker_url import node_urls

#: Seconds one request to the management API may take.
TIMEOUT = 15.0


@dataclass(frozen=True)
class BrokerAdmin:
    #: ``http(s)://host:port`` of the management API, without credentials.
    base: str
    user: str
    password: str
    vhost: str

    @classmethod
    def from_settings(cls, settings: Settings) -> BrokerAdmin:
        transport = urlsplit(node_urls(settings.transport_url)[0])
        vhost = unquote(transport.path[1:]) if len(transport.path) > 1 else "/"
        configured = settings.rpc.management_url
        api = urlsplit(configured) if configured else None
        if api is None:
            scheme = "https" if transport.scheme == "amqps" else "http"
            port = 15671 if transport.scheme == "amqps" else 15672
            base = f"{scheme}://{transport.hostname or '127.0.0.1'}:{port}"
            user, password = transport.username, transport.password
        else:
            netloc = api.netloc.rpartition("@")[2]
            base = f"{api.scheme}://{netloc}"
            user = api.username or transport.username
            password = api.password if api.username else transport.password
        return cls(
            base=base.rstrip("/"),
            user=unquote(user or "guest"),
            password=unquote(password or "guest"),
            vhost=vhost,
        )

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request = urllib.request.Request(
            f"{self.base}/api{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "DELETE":
                return None
            detail = exc.read()[:300].decode("utf-8", errors="replace")
            hint = (
                f"; user {self.user!r} needs the administrator tag"
                if exc.code in (401, 403)
                else ""
            )
            raise KeelError(
                f"the RabbitMQ management API at {self.base} answered {method} {path} with "
                f"{exc.code}: {detail}{hint}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KeelError(
                f"cannot reach the RabbitMQ management API at {self.base} ({reason}): enable "
                "it on the broker (rabbitmq-plugins enable rabbitmq_management) or set "
                "KEEL_RPC__MANAGEMENT_URL"
            ) from None
        return json.loads(text) if text else None

    async def put_user(self, user: str, password: str, permissions: Permissions) -> None:
        """Create ``user`` (or give it a new password) with exactly ``permissions``."""
        await asyncio.to_thread(self._put_user, user, password, permissions)

    def _put_user(self, user: str, password: str, permissions: Permissions) -> None:
        name, vhost = quote(user, safe=""), quote(self.vhost, safe="")
        self._request("PUT", f"/users/{name}", {"password": password, "tags": ""})
        self._request(
            "PUT",
            f"/permissions/{vhost}/{name}",
            {
                "configure": permissions.configure,
                "write": permissions.write,
                "read": permissions.read,
            },
        )
        for topic in permissions.topics:
            self._request(
                "PUT",
                f"/topic-permissions/{vhost}/{name}",
                {"exchange": topic.exchange, "write": topic.write, "read": topic.read},
            )

    async def delete_user(self, user: str) -> None:
        """Remove ``user``, closing its connections (done if it does not exist)."""
        await asyncio.to_thread(self._request, "DELETE", f"/users/{quote(user, safe='')}")
