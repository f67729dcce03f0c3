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


async def list_flavors(
    conn: Connection, *, is_public: bool | None = True, project_id: str | None = None
) -> list[Flavor]:
    """Live flavors ordered by flavor id; ``is_public=None`` lists public and private.

    With ``is_public=True`` and a ``project_id``, private flavors whose access list
    holds the project are listed too, as in Nova.
    """
    rows = await conn.fetch(
        """SELECT * FROM flavors f
            WHERE deleted_at IS NULL
              AND ($1::boolean IS NULL OR is_public = $1
                   OR ($1 AND EXISTS (SELECT 1 FROM flavor_projects p
                                       WHERE p.flavor_id = f.id AND p.project_id = $2)))
            ORDER BY flavorid""",
        is_public,
        project_id,
    )
    return [Flavor.from_row(row) for row in rows]


async def has_access(conn: Connection, flavor: Flavor, project_id: str | None) -> bool:
    """Whether ``project_id`` is on the flavor's access list."""
    found = await conn.fetchval(
        "SELECT 1 FROM flavor_projects WHERE flavor_id = $1 AND project_id = $2",
        flavor.id,
        project_id,
    )
    return found is not None


async def access_list(conn: Connection, flavor: Flavor) -> list[str]:
    rows = await conn.fetch(
        "SELECT project_id FROM flavor_projects WHERE flavor_id = $1 ORDER BY project_id",
        flavor.id,
    )
    return [row["project_id"] for row in rows]


async def add_access(conn: Connection, flavor: Flavor, project_id: str) -> bool:
    """False if the project was on the list already."""
    status = await conn.execute(
        """INSERT INTO flavor_projects (flavor_id, project_id) VALUES ($1, $2)
           ON CONFLICT DO NOTHING""",
        flavor.id,
        project_id,
    )
    return status != "INSERT 0 0"


async def remove_access(conn: Connection, flavor: Flavor, project_id: str) -> bool:
    """False if the project was not on the list."""
    status = await conn.execute(
        "DELETE FROM flavor_projects WHERE flavor_id = $1 AND project_id = $2",
        flavor.id,
        project_id,
    )
    return status != "DELETE 0"


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
