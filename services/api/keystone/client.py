"""keel-api's client of Keystone: its service token, token validation, project look-ups.

keel-api authenticates to Keystone as its service user (password, scoped to its
project) and keeps that token until shortly before it expires, or until Keystone
refuses it. A token is validated with ``GET /v3/auth/tokens`` (``X-Subject-Token``).
Keystone not answering, answering 5xx or timing out is :class:`KeystoneUnreachable`;
Keystone refusing keel-api's own credentials is :class:`KeystoneRefused`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from shared.config import IdentitySettings, TokenInfo
from shared.exceptions import KeelError

LOG = logging.getLogger(__name__)

#: A service token is replaced this many seconds before it expires.
RENEW_BEFORE = 60.0


class KeystoneUnreachable(KeelError):
    """Keystone did not answer, or answered with a server error."""


class KeystoneRefused(KeelError):
    """Keystone refused keel-api's service credentials (or their right to validate)."""


@dataclass(frozen=True)
class Validated:
    """What Keystone said a token stands for, and until when it is valid."""

    info: TokenInfo | None
    expires_at: datetime
    #: Why keel refuses a token Keystone accepts (e.g. not scoped to a project).
    refusal: str | None = None


def v3_url(url: str) -> str:
    """``http://keystone:5000`` or ``…/v3`` or ``…/v3/``: always ``…/v3``."""
    url = url.rstrip("/")
    return url if url.endswith("/v3") else url + "/v3"


def parse_time(text: str) -> datetime:
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def validated(body: dict[str, Any]) -> Validated:
    """Keystone's token body, read as keel needs it."""
    token = body["token"]
    expires = parse_time(token["expires_at"])
    project = token.get("project")
    if not project:
        return Validated(None, expires, "keel needs a token scoped to a project.")
    info = TokenInfo(
        user_id=token["user"]["id"],
        project_id=project["id"],
        roles=[role["name"] for role in token.get("roles", [])],
    )
    return Validated(info, expires)


class KeystoneClient:
    def __init__(self, settings: IdentitySettings, http: httpx.AsyncClient) -> None:
        assert settings.keystone_url is not None
        self.url = v3_url(settings.keystone_url)
        self._settings = settings
        self._http = http
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = asyncio.Lock()

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request (twice if a kept-alive connection broke under it; never after a
        timeout, so an outage costs at most ``keystone_timeout``)."""
        url, timeout = self.url + path, self._settings.keystone_timeout
        try:
            try:
                response = await self._http.request(method, url, timeout=timeout, **kwargs)
            except httpx.TimeoutException:
                raise
            except httpx.TransportError:
                response = await self._http.request(method, url, timeout=timeout, **kwargs)
        except httpx.HTTPError as exc:
            raise KeystoneUnreachable(
                f"Keystone at {self.url} did not answer: {type(exc).__name__} {exc}".rstrip()
            ) from None
        if response.status_code >= 500:
            raise KeystoneUnreachable(f"Keystone at {self.url} answered {response.status_code}")
        return response

    def _auth_body(self) -> dict[str, Any]:
        s = self._settings
        user = {
            "name": s.keystone_username,
            "password": s.keystone_password,
            "domain": {"name": s.keystone_user_domain_name},
        }
        project = {
            "name": s.keystone_project_name,
            "domain": {"name": s.keystone_project_domain_name},
        }
        return {
            "auth": {
                "identity": {"methods": ["password"], "password": {"user": user}},
                "scope": {"project": project},
            }
        }

    async def service_token(self) -> str:
        """keel-api's own token, fetched again shortly before it expires."""
        async with self._lock:
            if self._token is not None and time.monotonic() < self._renew_at:
                return self._token
            response = await self._send("POST", "/auth/tokens", json=self._auth_body())
            if response.status_code != 201:
                raise KeystoneRefused(
                    f"Keystone at {self.url} refused keel-api's service credentials (user "
                    f"{self._settings.keystone_username!r}, project "
                    f"{self._settings.keystone_project_name!r}): {response.status_code}"
                )
            expires = parse_time(response.json()["token"]["expires_at"])
            lifetime = (expires - datetime.now(UTC)).total_seconds()
            self._token = response.headers["X-Subject-Token"]
            self._renew_at = time.monotonic() + max(0.0, lifetime - RENEW_BEFORE)
            LOG.info("got a service token from Keystone at %s, valid %.0fs", self.url, lifetime)
            return self._token

    def forget_service_token(self) -> None:
        self._token = None

    async def _as_service(self, method: str, path: str, **headers: str) -> httpx.Response:
        """A request with keel-api's token; once more with a new one if it was refused."""
        for attempt in (1, 2):
            token = await self.service_token()
            response = await self._send(method, path, headers={"X-Auth-Token": token, **headers})
            if response.status_code != 401 or attempt == 2:
                return response
            self.forget_service_token()
        raise AssertionError("unreachable")

    async def validate(self, token: str) -> Validated | None:
        """What ``token`` stands for; None if Keystone says it is not valid (404)."""
        response = await self._as_service("GET", "/auth/tokens", **{"X-Subject-Token": token})
        if response.status_code == 200:
            return validated(response.json())
        if response.status_code == 401:
            raise KeystoneRefused(
                f"Keystone at {self.url} refused keel-api's own token twice: check "
                "KEEL_IDENTITY__KEYSTONE_USERNAME and its password"
            )
        if response.status_code == 403:
            raise KeystoneRefused(
                f"Keystone at {self.url} does not let keel-api's service user "
                f"{self._settings.keystone_username!r} validate tokens: give it the service "
                "or admin role in its project"
            )
        return None

    async def project_exists(self, project_id: str) -> bool:
        """Whether Keystone knows the project (True when it will not say: 403)."""
        response = await self._as_service("GET", f"/projects/{project_id}")
        return response.status_code != 404
