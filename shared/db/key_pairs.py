"""Queries on ``key_pairs``, and the key pair a server records at create time.

Key pairs belong to a user and are named uniquely per user. Creation takes a per-user
transaction-scoped advisory lock, so the count checked against the quota cannot change
before the new row is committed.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, KeyPairNotFound
from shared.objects.key_pair import KeyPair, KeyPairType

#: First key of the two-key advisory lock that serialises one user's key pair creations.
_LOCK_CLASS = 0x6B657970  # "keyp"


async def lock_user(conn: Connection, user_id: str) -> None:
    """Serialise key pair creation for ``user_id`` until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, user_id)


async def count(conn: Connection, user_id: str) -> int:
    found: int = await conn.fetchval("SELECT count(*) FROM key_pairs WHERE user_id = $1", user_id)
    return found


async def create(
    conn: Connection,
    *,
    user_id: str,
    name: str,
    key_type: KeyPairType,
    public_key: str,
    fingerprint: str,
) -> KeyPair:
    try:
        row = await conn.fetchrow(
            """INSERT INTO key_pairs (user_id, name, type, public_key, fingerprint)
               VALUES ($1, $2, $3, $4, $5) RETURNING *""",
            user_id,
            name,
            key_type.value,
            public_key,
            fingerprint,
        )
    except asyncpg.UniqueViolationError:
        raise AlreadyExists(f"Key pair '{name}' already exists.") from None
    assert row is not None
    return KeyPair.from_row(row)


async def get(conn: Connection, user_id: str, name: str) -> KeyPair:
    row = await conn.fetchrow(
        "SELECT * FROM key_pairs WHERE user_id = $1 AND name = $2", user_id, name
    )
    if row is None:
        raise KeyPairNotFound(f"Keypair {name} not found for user {user_id}")
    return KeyPair.from_row(row)


async def list_page(
    conn: Connection, user_id: str, *, marker: str | None = None, limit: int | None = None
) -> list[KeyPair]:
    """The user's key pairs by name, after the key pair named ``marker``."""
    if marker is not None:
        await get(conn, user_id, marker)
    rows = await conn.fetch(
        """SELECT * FROM key_pairs
            WHERE user_id = $1 AND ($2::text IS NULL OR name > $2)
            ORDER BY name LIMIT $3""",
        user_id,
        marker,
        limit,
    )
    return [KeyPair.from_row(row) for row in rows]


async def delete(conn: Connection, user_id: str, name: str) -> None:
    status = await conn.execute(
        "DELETE FROM key_pairs WHERE user_id = $1 AND name = $2", user_id, name
    )
    if status == "DELETE 0":
        raise KeyPairNotFound(f"Keypair {name} not found for user {user_id}")


async def record_on_instance(conn: Connection, instance_uuid: UUID, key: KeyPair) -> None:
    """Keep the key pair's name and public key on the server, as they were at create time."""
    await conn.execute(
        "UPDATE instances SET key_name = $2, key_data = $3 WHERE uuid = $1",
        instance_uuid,
        key.name,
        key.public_key,
    )
