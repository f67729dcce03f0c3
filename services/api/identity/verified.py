"""Passwords keel-api verified lately, kept as keyed digests so a repeated login skips scrypt.

scrypt is slow on purpose (:mod:`shared.passwords`: tens of milliseconds of CPU), and a
client that logs in again and again with the same password — Rally every iteration, the
``openstack`` CLI every command — paid it every time although nothing had changed. Once
a password has verified against a user's stored hash, keel-api keeps, for that user,
``HMAC-SHA256(key, user id, stored hash, password)`` under a key drawn at random when
the process starts, which never leaves the process. A later login with the same
password against the same stored hash computes that HMAC (a few microseconds) and, if it
equals the one kept (compared in constant time), is verified without scrypt.

Why it is safe:

* **Never stale.** The user's row is still read on every login, and the stored hash is
  part of the digest: a new password (a new salt, so a new hash), whoever set it
  (keel-api, another keel-api, ``keel-manage``), never matches an entry made for the old
  one. A disabled user is refused by the row, and their entry is dropped; a deleted user
  has no row to match.
* **A wrong password is never served from here**: it gives another digest, so it goes
  through scrypt, and a failure is not remembered.
* **No password in memory** beyond the request: only the digest is kept. Whoever can read
  keel-api's memory could read the key too and test guesses at HMAC speed against the
  users kept here — but they could as well read passwords from requests in flight.
* **Bounded**: at most ``max_entries`` users (least recently used dropped first).
* **Timing**: only a correct password can be answered fast, so the time a login takes
  tells nothing to someone who does not already hold the password.

Concurrent first logins of one user with one password share one scrypt run.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable

from shared.passwords import verify_password

#: Users whose last verified password is kept; beyond it the least recently used go.
MAX_ENTRIES = 10000
KEY_BYTES = 32

#: ``verify_password``'s shape: the slow check, run in a worker thread.
Verifier = Callable[[str, str], bool]


class VerifiedPasswords:
    """Per user, the keyed digest of the password that last verified against their hash."""

    def __init__(
        self, *, max_entries: int = MAX_ENTRIES, verifier: Verifier = verify_password
    ) -> None:
        self.max_entries = max_entries
        self._verifier = verifier
        self._key = secrets.token_bytes(KEY_BYTES)
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._in_flight: dict[bytes, asyncio.Task[bool]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _digest(self, user_id: str, stored: str, password: str) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (user_id, stored, password):
            encoded = part.encode("utf-8", "surrogateescape")
            # Each part's length first, so no two different triples read the same.
            mac.update(len(encoded).to_bytes(8, "big"))
            mac.update(encoded)
        return mac.digest()

    def _kept(self, user_id: str, digest: bytes) -> bool:
        kept = self._entries.get(user_id)
        if kept is None or not hmac.compare_digest(kept, digest):
            return False
        self._entries.move_to_end(user_id)
        return True

    def forget(self, user_id: str) -> None:
        """Drop what is kept for ``user_id`` (disabled: their next login pays scrypt)."""
        self._entries.pop(user_id, None)

    def _remember(self, user_id: str, digest: bytes) -> None:
        self._entries[user_id] = digest
        self._entries.move_to_end(user_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def verify(self, user_id: str, stored: str, password: str) -> bool:
        """Whether ``password`` matches ``stored``, the hash read from ``user_id``'s row
        just now: from the digest kept if it matches, else by scrypt (remembered if
        right)."""
        digest = self._digest(user_id, stored, password)
        if self._kept(user_id, digest):
            return True
        task = self._in_flight.get(digest)
        if task is None:
            task = asyncio.create_task(self._check(user_id, stored, password, digest))
            self._in_flight[digest] = task
            task.add_done_callback(lambda _: self._in_flight.pop(digest, None))
        # Shielded: a login cut off mid-way leaves the scrypt run to those sharing it.
        return await asyncio.shield(task)

    async def _check(self, user_id: str, stored: str, password: str, digest: bytes) -> bool:
        matches = await asyncio.to_thread(self._verifier, password, stored)
        if matches:
            self._remember(user_id, digest)
        return matches
