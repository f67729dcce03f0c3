"""A Keystone in memory, behind httpx.MockTransport: tokens it issued, revokes, or cannot
validate because it is down."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from shared.config import IdentitySettings

SERVICE_TOKEN = "service-token"
SETTINGS = IdentitySettings(
    keystone_url="http://keystone.test:5000",
    keystone_username="keel",
    keystone_password="keel-pw",
)


class FakeKeystone:
    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, Any]] = {}
        self.projects = {"p1"}
        self.down = False
        self.service_valid = True
        self.service_tokens_issued = 0
        self.validations = 0
        self.forbid_validation = False
        #: Requests whose kept-alive connection breaks before any answer, then it works.
        self.broken_connections = 0

    def issue(self, token: str, *, project: str | None = "p1", lifetime: float = 3600) -> None:
        body: dict[str, Any] = {
            "user": {"id": f"user-of-{token}", "name": "u"},
            "roles": [{"id": "r1", "name": "member"}, {"id": "r2", "name": "reader"}],
            "expires_at": (datetime.now(UTC) + timedelta(seconds=lifetime)).isoformat(),
        }
        if project is not None:
            body["project"] = {"id": project, "name": project}
        self.tokens[token] = body

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.broken_connections:
            self.broken_connections -= 1
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        path = request.url.path
        if request.method == "POST" and path == "/v3/auth/tokens":
            return self._service_login(json.loads(request.content))
        if request.headers.get("X-Auth-Token") != SERVICE_TOKEN or not self.service_valid:
            return httpx.Response(401, json={"error": {"code": 401}})
        if path == "/v3/auth/tokens":
            return self._validate(request.headers["X-Subject-Token"])
        if path.startswith("/v3/projects/"):
            found = path.rsplit("/", 1)[1] in self.projects
            return httpx.Response(200 if found else 404, json={})
        return httpx.Response(404, json={})

    def _service_login(self, body: dict[str, Any]) -> httpx.Response:
        user = body["auth"]["identity"]["password"]["user"]
        if (user["name"], user["password"]) != ("keel", "keel-pw"):
            return httpx.Response(401, json={"error": {"code": 401}})
        self.service_tokens_issued += 1
        self.service_valid = True
        expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        return httpx.Response(
            201, json={"token": {"expires_at": expires}}, headers={"X-Subject-Token": SERVICE_TOKEN}
        )

    def _validate(self, subject: str) -> httpx.Response:
        self.validations += 1
        if self.forbid_validation:
            return httpx.Response(403, json={"error": {"code": 403}})
        body = self.tokens.get(subject)
        if body is None:
            return httpx.Response(404, json={"error": {"code": 404}})
        return httpx.Response(200, json={"token": body}, headers={"X-Subject-Token": subject})
