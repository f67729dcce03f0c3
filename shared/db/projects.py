"""Queries on ``projects``: the tenants that own servers, quotas and users' roles."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, Conflict, ProjectNotFound
from shared.objects.identity import Project, ProjectChanges

_COLUMNS = "p.id, p.name, p.description, p.enabled, p.extra, p.created_at"


def _taken(name: str) -> AlreadyExists:
    return AlreadyExists(f"a project named {name!r} already exists")


async def create(
    conn: Connection,
    name: str,
    description: str = "",
    *,
    enabled: bool = True,
    extra: dict[str, Any] | None = None,
) -> Project:
    """A new project with a new id; a name already in use is :class:`AlreadyExists`."""
    try:
        row = await conn.fetchrow(
            f"""INSERT INTO projects AS p (id, name, description, enabled, extra)
                VALUES ($1, $2, $3, $4, $5) RETURNING {_COLUMNS}""",
            uuid.uuid4().hex,
            name,
            description,
            enabled,
            extra or {},
        )
    except asyncpg.UniqueViolationError:
        raise _taken(name) from None
    assert row is not None
    return Project.from_row(row)


async def get(conn: Connection, project_id: str) -> Project:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM projects p WHERE p.id = $1", project_id)
    if row is None:
        raise ProjectNotFound(f"Could not find project: {project_id}.")
    return Project.from_row(row)


async def find(conn: Connection, name_or_id: str) -> Project:
    """The project with this id, else the one with this name."""
    row = await conn.fetchrow(
        f"""SELECT {_COLUMNS} FROM projects p WHERE p.id = $1
            UNION ALL SELECT {_COLUMNS} FROM projects p WHERE p.name = $1""",
        name_or_id,
    )
    if row is None:
        raise ProjectNotFound(f"no project has the name or id {name_or_id!r}")
    return Project.from_row(row)


async def list_projects(
    conn: Connection, *, name: str | None = None, enabled: bool | None = None
) -> list[Project]:
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM projects p
             WHERE ($1::text IS NULL OR p.name = $1) AND ($2::boolean IS NULL OR p.enabled = $2)
             ORDER BY p.name""",
        name,
        enabled,
    )
    return [Project.from_row(row) for row in rows]


async def exists(conn: Connection, project_id: str) -> bool:
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM projects WHERE id = $1)", project_id
    )
    return found


async def update(conn: Connection, project_id: str, changes: ProjectChanges) -> Project:
    """Apply the fields ``changes`` was given; disabling revokes the project's tokens."""
    async with conn.transaction():
        try:
            row = await conn.fetchrow(
                f"""UPDATE projects p SET name = coalesce($2, p.name),
                           description = coalesce($3, p.description),
                           enabled = coalesce($4, p.enabled),
                           extra = p.extra || $5::jsonb
                     WHERE p.id = $1 RETURNING {_COLUMNS}""",
                project_id,
                changes.name,
                changes.description,
                changes.enabled,
                changes.extra or {},
            )
        except asyncpg.UniqueViolationError:
            raise _taken(str(changes.name)) from None
        if row is None:
            raise ProjectNotFound(f"Could not find project: {project_id}.")
        if changes.enabled is False:
            await conn.execute("DELETE FROM identity_tokens WHERE project_id = $1", project_id)
    return Project.from_row(row)


async def delete(conn: Connection, project: Project) -> None:
    """Delete a project that has no live servers (:class:`Conflict` otherwise).

    Its role assignments, the tokens scoped to it and its quota settings go with it;
    users whose default project it was keep no default project.
    """
    async with conn.transaction():
        servers = await conn.fetchval(
            "SELECT count(*) FROM instances WHERE project_id = $1 AND deleted_at IS NULL",
            project.id,
        )
        if servers:
            raise Conflict(
                f"project {project.name!r} still has {servers} server(s): delete them first"
            )
        await conn.execute("DELETE FROM quotas WHERE project_id = $1", project.id)
        await conn.execute("DELETE FROM user_quotas WHERE project_id = $1", project.id)
        status = await conn.execute("DELETE FROM projects WHERE id = $1", project.id)
    if status == "DELETE 0":
        raise ProjectNotFound(f"Could not find project: {project.id}.")
