"""Queries on ``role_assignments``: which roles each user holds in which project.

A user may hold several roles in a project. Granting a role held already changes
nothing; revoking one revokes the user's tokens for that project (as Keystone does), so
a token never outlives a role it was issued with.
"""

from __future__ import annotations

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import NotFound
from shared.objects.base import KeelModel


class Assignment(KeelModel):
    """One role held by one user in one project, with the three names."""

    user_id: str
    user_name: str
    project_id: str
    project_name: str
    role_id: str
    role_name: str


async def grant(conn: Connection, user_id: str, project_id: str, role_id: str) -> bool:
    """Give the user the role in the project; False if they held it already."""
    try:
        status = await conn.execute(
            """INSERT INTO role_assignments (user_id, project_id, role_id) VALUES ($1, $2, $3)
               ON CONFLICT DO NOTHING""",
            user_id,
            project_id,
            role_id,
        )
    except asyncpg.ForeignKeyViolationError:
        raise NotFound(
            f"Could not grant role {role_id} to user {user_id} on project {project_id}: "
            "one of them no longer exists."
        ) from None
    return status != "INSERT 0 0"


async def revoke(conn: Connection, user_id: str, project_id: str, role_id: str) -> bool:
    """Take the role away, and the user's tokens for the project; False if not held."""
    async with conn.transaction():
        status = await conn.execute(
            "DELETE FROM role_assignments WHERE user_id = $1 AND project_id = $2 AND role_id = $3",
            user_id,
            project_id,
            role_id,
        )
        if status == "DELETE 0":
            return False
        await conn.execute(
            "DELETE FROM identity_tokens WHERE user_id = $1 AND project_id = $2",
            user_id,
            project_id,
        )
    return True


async def holds(conn: Connection, user_id: str, project_id: str, role_id: str) -> bool:
    found: bool = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM role_assignments
                           WHERE user_id = $1 AND project_id = $2 AND role_id = $3)""",
        user_id,
        project_id,
        role_id,
    )
    return found


async def list_assignments(
    conn: Connection,
    *,
    user_id: str | None = None,
    project_id: str | None = None,
    role_id: str | None = None,
) -> list[Assignment]:
    """Every assignment matching the filters given, by user, project and role name."""
    rows = await conn.fetch(
        """SELECT a.user_id, u.name AS user_name, a.project_id, p.name AS project_name,
                  a.role_id, r.name AS role_name
             FROM role_assignments a
             JOIN users u ON u.id = a.user_id
             JOIN projects p ON p.id = a.project_id
             JOIN roles r ON r.id = a.role_id
            WHERE ($1::text IS NULL OR a.user_id = $1)
              AND ($2::text IS NULL OR a.project_id = $2)
              AND ($3::text IS NULL OR a.role_id = $3)
            ORDER BY u.name, p.name, r.name""",
        user_id,
        project_id,
        role_id,
    )
    return [Assignment.from_row(row) for row in rows]
