"""Queries on ``identity_tokens``: tokens issued by the identity API.

A token is stored only as its SHA-256 digest: tokens are long random strings, so a
fast hash is enough, and whoever reads the table cannot use what they read. A token is
valid while it has not expired and its user still holds a role in its project.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from shared.db import users
from shared.db.pool import Connection
from shared.objects.identity import IssuedToken, Membership


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


async def issue(
    conn: Connection, token: str, membership: Membership, audit_id: str, expires_at: datetime
) -> IssuedToken:
    """Record ``token`` for the membership; expired tokens are purged on the way."""
    async with conn.transaction():
        await conn.execute("DELETE FROM identity_tokens WHERE expires_at < now()")
        row = await conn.fetchrow(
            """INSERT INTO identity_tokens (token_hash, user_id, project_id, audit_id, expires_at)
               VALUES ($1, $2, $3, $4, $5) RETURNING issued_at, expires_at""",
            digest(token),
            membership.user.id,
            membership.project.id,
            audit_id,
            expires_at,
        )
    assert row is not None
    return IssuedToken(
        membership=membership,
        audit_id=audit_id,
        issued_at=row["issued_at"],
        expires_at=row["expires_at"],
    )


async def find_valid(conn: Connection, token: str) -> IssuedToken | None:
    """What ``token`` stands for, or ``None`` if it is unknown, expired or revoked."""
    row = await conn.fetchrow(
        f"""SELECT {users.MEMBERSHIP_COLUMNS}, t.audit_id, t.issued_at, t.expires_at
              {users.MEMBERSHIP_FROM}
              JOIN identity_tokens t ON t.user_id = r.user_id AND t.project_id = r.project_id
             WHERE t.token_hash = $1 AND t.expires_at > now()""",
        digest(token),
    )
    if row is None:
        return None
    return IssuedToken(
        membership=users.membership_from_row(row),
        audit_id=row["audit_id"],
        issued_at=row["issued_at"],
        expires_at=row["expires_at"],
    )


async def revoke(conn: Connection, token: str) -> bool:
    """Forget ``token``; False if it was not known."""
    status = await conn.execute("DELETE FROM identity_tokens WHERE token_hash = $1", digest(token))
    return status != "DELETE 0"
