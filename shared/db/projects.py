"""Queries on ``projects``: the tenants that own servers, quotas and users' roles."""

from __future__ import annotations

import uuid

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, Conflict, ProjectNotFound
from shared.objects.identity import Project


async def create(conn: Connection, name: str, description: str = "") -> Project:
    """A new project with a new id; a name already in use is :class:`AlreadyExists`."""
    try:
        row = await conn.fetchrow(
            "INSERT INTO projects (id, name, description) VALUES ($1, $2, $3) RETURNING *",
            uuid.uuid4().hex,
            name,
            description,
        )
    except asyncpg.UniqueViolationError:
        raise AlreadyExists(f"a project named {name!r} already exists") from None
    assert row is not None
    return Project.from_row(row)


async def get(conn: Connection, project_id: str) -> Project:
    row = await conn.fetchrow("SELECT * FROM projects WHERE id = $1", project_id)
    if row is None:
        raise ProjectNotFound(f"Could not find project: {project_id}.")
    return Project.from_row(row)


async def find(conn: Connection, name_or_id: str) -> Project:
    """The project with this id, else the one with this name."""
    row = await conn.fetchrow(
        "SELECT * FROM projects WHERE id = $1 UNION ALL SELECT * FROM projects WHERE name = $1",
        name_or_id,
    )
    if row is None:
        raise ProjectNotFound(f"no project has the name or id {name_or_id!r}")
    return Project.from_row(row)


async def list_projects(conn: Connection, *, name: str | None = None) -> list[Project]:
    rows = await conn.fetch(
        "SELECT * FROM projects WHERE ($1::text IS NULL OR name = $1) ORDER BY name", name
    )
    return [Project.from_row(row) for row in rows]


async def exists(conn: Connection, project_id: str) -> bool:
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM projects WHERE id = $1)", project_id
    )
    return found


async def delete(conn: Connection, project: Project) -> None:
    """Delete a project that has no users and no live servers; :class:`Conflict` otherwise."""
    async with conn.transaction():
        users = await conn.fetch(
            """SELECT u.name FROM role_assignments r JOIN users u ON u.id = r.user_id
                WHERE r.project_id = $1 ORDER BY u.name""",
            project.id,
        )
        if users:
            names = ", ".join(row["name"] for row in users)
            raise Conflict(f"project {project.name!r} still has users ({names}): delete them first")
        servers = await conn.fetchval(
            "SELECT count(*) FROM instances WHERE project_id = $1 AND deleted_at IS NULL",
            project.id,
        )
        if servers:
            raise Conflict(
                f"project {project.name!r} still has {servers} server(s): delete them first"
            )
        await conn.execute(
            "UPDATE users SET default_project_id = NULL WHERE default_project_id = $1", project.id
        )
        await conn.execute("DELETE FROM quotas WHERE project_id = $1", project.id)
        await conn.execute("DELETE FROM projects WHERE id = $1", project.id)
