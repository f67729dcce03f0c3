"""Tokens Keystone validated, cached for a bounded time, as keystonemiddleware does.

Each answer (valid: who the token stands for; invalid) is kept for
``KEEL_IDENTITY__TOKEN_CACHE_TIME`` seconds at most, and never past the token's own
expiry; then Keystone is asked again, so a token Keystone revoked is refused within that
bound. Concurrent requests with the same token wait for one validation. While Keystone
cannot be reached, a token whose answer is still cached is served as cached, and any
other gets 503 (a token is never taken on trust). The cache holds tokens only as their
SHA-256 digests, is bounded in size, and SIGHUP empties it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from services.api.http.faults import Forbidden, ServiceUnavailable
from services.api.keystone.client import (
    KeystoneClient,
    KeystoneRefused,
    KeystoneUnreachable,
    Validated,
)
from shared.config import Settings, TokenInfo

LOG = logging.getLogger(__name__)

#: The most answers kept; beyond it the oldest go first.
MAX_ENTRIES = 10000


@dataclass(frozen=True)
class _Entry:
    answer: Validated | None
    #: ``time.monotonic()`` after which Keystone is asked again.
    until: float


class KeystoneTokens:
    """Who a token stands for, according to Keystone, through a bounded cache."""

    def __init__(
        self,
        client: KeystoneClient,
        cache_time: float,
        *,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.cache_time = cache_time
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[bytes, _Entry] = {}
        self._in_flight: dict[bytes, asyncio.Task[Validated | None]] = {}

    def reset(self) -> None:
        """Forget every answer (SIGHUP): each token is validated again when next used."""
        LOG.info("forgetting %d cached token validations", len(self._entries))
        self._entries.clear()

    async def reload(self, settings: Settings) -> None:
        """SIGHUP: take the cache time as re-read, and forget every answer."""
        self.cache_time = settings.identity.token_cache_time
        self.reset()

    def __len__(self) -> int:
        return len(self._entries)

    async def identify(self, token: str) -> TokenInfo | None:
        """Who ``token`` stands for; None if not valid; 503 if Keystone cannot say."""
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        entry = self._entries.get(key)
        if entry is None or entry.until <= self._clock():
            answer = await self._validate(key, token)
        else:
            answer = entry.answer
        if answer is None:
            return None
        if answer.refusal is not None:
            raise Forbidden(answer.refusal)
        return answer.info

    async def _validate(self, key: bytes, token: str) -> Validated | None:
        task = self._in_flight.get(key)
        if task is None:
            task = asyncio.create_task(self._ask(key, token))
            self._in_flight[key] = task
            task.add_done_callback(lambda _: self._in_flight.pop(key, None))
        try:
            return await asyncio.shield(task)
        except KeystoneUnreachable as exc:
            LOG.warning("cannot validate a token: %s", exc.message)
            raise ServiceUnavailable(
                "keel-api cannot reach Keystone to validate the token. Retry in a few seconds."
            ) from None
        except KeystoneRefused as exc:
            LOG.error("cannot validate a token: %s", exc.message)
            raise ServiceUnavailable(
                "keel-api cannot validate tokens with Keystone at the moment."
            ) from None

    async def _ask(self, key: bytes, token: str) -> Validated | None:
        answer = await self.client.validate(token)
        keep = self.cache_time
        if answer is not None:
            keep = min(keep, (answer.expires_at - datetime.now(UTC)).total_seconds())
        if keep > 0:
            self._store(key, _Entry(answer, self._clock() + keep))
        return answer

    def _store(self, key: bytes, entry: _Entry) -> None:
        self._entries.pop(key, None)
        self._entries[key] = entry
        if len(self._entries) > self.max_entries:
            now = self._clock()
            for stale in [k for k, e in self._entries.items() if e.until <= now]:
                del self._entries[stale]
            while len(self._entries) > self.max_entries:
                del self._entries[next(iter(self._entries))]

    async def project_known(self, project_id: str) -> bool:
        """Whether Keystone knows ``project_id``; 503 if it cannot say."""
        try:
            return await self.client.project_exists(project_id)
        except (KeystoneUnreachable, KeystoneRefused) as exc:
            LOG.warning("cannot look project %s up: %s", project_id, exc.message)
            raise ServiceUnavailable(
                "keel-api cannot reach Keystone to look the project up. Retry in a few seconds."
            ) from None
