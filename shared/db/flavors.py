"""Queries on ``flavors``."""

from __future__ import annotations

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import Conflict, FlavorNotFound
from shared.objects.flavor import Flavor


async def get(conn: Connection, flavorid: str) -> Flavor:
    row = await conn.fetchrow(
        "SELECT * FROM flavors WHERE flavorid = $1 AND deleted_at IS NULL", flavorid
    )
    if row is None:
        raise FlavorNotFound(f"Flavor {flavorid} could not be found.")
    return Flavor.from_row(row)


async def list_flavors(conn: Connection, *, is_public: bool | None = True) -> list[Flavor]:
    """Live flavors ordered by flavor id; ``is_public=None`` lists public and private."""
    rows = await conn.fetch(
        """SELECT * FROM flavors
            WHERE deleted_at IS NULL AND ($1::boolean IS NULL OR is_public = $1)
            ORDER BY flavorid""",
        is_public,
    )
    return [Flavor.from_row(row) for row in rows]


async def create(
    conn: Connection,
    *,
    flavorid: str,
    name: str,
    vcpus: int,
    memory_mb: int,
    root_gb: int,
    ephemeral_gb: int = 0,
    swap: int = 0,
    rxtx_factor: float = 1.0,
    is_public: bool = True,
    description: str | None = None,
) -> Flavor:
    try:
        row = await conn.fetchrow(
            """INSERT INTO flavors (flavorid, name, vcpus, memory_mb, root_gb, ephemeral_gb,
                                    swap, rxtx_factor, is_public, description)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING *""",
            flavorid,
            name,
            vcpus,
            memory_mb,
            root_gb,
            ephemeral_gb,
            swap,
            rxtx_factor,
            is_public,
            description,
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"Flavor with name {name} or ID {flavorid} already exists.") from None
    assert row is not None
    return Flavor.from_row(row)


async def delete(conn: Connection, flavorid: str) -> None:
    status = await conn.execute(
        "UPDATE flavors SET deleted_at = now() WHERE flavorid = $1 AND deleted_at IS NULL",
        flavorid,
    )
    if status == "UPDATE 0":
        raise FlavorNotFound(f"Flavor {flavorid} could not be found.")


async def _returning(conn: Connection, flavorid: str, sql: str, *args: object) -> Flavor:
    row = await conn.fetchrow(sql, flavorid, *args)
    if row is None:
        raise FlavorNotFound(f"Flavor {flavorid} could not be found.")
    return Flavor.from_row(row)


async def set_description(conn: Connection, flavorid: str, description: str | None) -> Flavor:
    return await _returning(
        conn,
        flavorid,
        """UPDATE flavors SET description = $2, updated_at = now()
            WHERE flavorid = $1 AND deleted_at IS NULL RETURNING *""",
        description,
    )


async def merge_extra_specs(conn: Connection, flavorid: str, specs: dict[str, str]) -> Flavor:
    """Add or change the given extra specs, keeping the others (one atomic update)."""
    return await _returning(
        conn,
        flavorid,
        """UPDATE flavors SET extra_specs = extra_specs || $2::jsonb, updated_at = now()
            WHERE flavorid = $1 AND deleted_at IS NULL RETURNING *""",
        specs,
    )


async def delete_extra_spec(conn: Connection, flavorid: str, key: str) -> bool:
    """Remove one extra spec; False if the flavor has none by that key."""
    status = await conn.execute(
        """UPDATE flavors SET extra_specs = extra_specs - $2, updated_at = now()
            WHERE flavorid = $1 AND deleted_at IS NULL AND extra_specs ? $2""",
        flavorid,
        key,
    )
    return status != "UPDATE 0"
