"""Password hashing: scrypt from the standard library, salted, slow on purpose.

A stored hash reads ``scrypt$N$r$p$SALT$DIGEST`` (salt and digest in URL-safe base64),
so the cost can be raised later without invalidating existing hashes. Passwords never
leave this module in any other form, and nothing here logs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

#: scrypt cost: 2**14 iterations of 8 blocks, ~16 MB of memory and tens of milliseconds.
COST_N = 2**14
BLOCK_R = 8
PARALLEL_P = 1
SALT_BYTES = 16
DIGEST_BYTES = 32
MAX_MEMORY = 64 * 1024 * 1024
#: Longer passwords are refused rather than hashed: a bound on the work one request costs.
MAX_LENGTH = 1024

_SCHEME = "scrypt"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=MAX_MEMORY,
        dklen=DIGEST_BYTES,
    )


def check_acceptable(password: str) -> None:
    """Raise ``ValueError`` (with a message for the operator) if ``password`` is unusable."""
    if not password:
        raise ValueError("the password is empty")
    if len(password) > MAX_LENGTH:
        raise ValueError(f"the password is longer than {MAX_LENGTH} characters")


def hash_password(password: str) -> str:
    """A new salted hash of ``password``, fit to store."""
    check_acceptable(password)
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, COST_N, BLOCK_R, PARALLEL_P)
    return f"{_SCHEME}${COST_N}${BLOCK_R}${PARALLEL_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    """True if ``password`` is the one ``stored`` was made from (constant-time compare)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != _SCHEME:
            return False
        expected = _unb64(digest)
        computed = _scrypt(password[: MAX_LENGTH + 1], _unb64(salt), int(n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(computed, expected) and len(password) <= MAX_LENGTH


def decoy_hash() -> str:
    """A hash no password matches, to spend the same time when a user does not exist."""
    salt, digest = _b64(bytes(SALT_BYTES)), _b64(bytes(DIGEST_BYTES))
    return f"{_SCHEME}${COST_N}${BLOCK_R}${PARALLEL_P}${salt}${digest}"
