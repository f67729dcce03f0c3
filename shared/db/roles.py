"""Queries on ``roles`` and ``implied_roles``: the roles users are given in projects.

Role names are unique whatever their case (``Member`` is ``member``), as the clients
that look roles up by name expect. A role implies others (``implied_roles``: admin >
manager > member > reader, as Keystone's bootstrap sets them); deleting a role takes its
assignments and implications with it.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, RoleNotFound
from shared.objects.identity import Role

_COLUMNS = "r.id, r.name, r.description, r.extra"


def _taken(name: str) -> AlreadyExists:
    return AlreadyExists(f"a role named {name!r} already exists")


async def create(
    conn: Connection,
    name: str,
    *,
    description: str | None = None,
    extra: dict[str, Any] | None = None,
    role_id: str | None = None,
) -> Role:
    """A new role; a name already taken (in any case) is :class:`AlreadyExists`."""
    try:
        row = await conn.fetchrow(
            f"""INSERT INTO roles AS r (id, name, description, extra) VALUES ($1, $2, $3, $4)
                RETURNING {_COLUMNS}""",
            role_id or uuid.uuid4().hex,
            name,
            description,
            extra or {},
        )
    except asyncpg.UniqueViolationError:
        raise _taken(name) from None
    assert row is not None
    return Role.from_row(row)


async def get(conn: Connection, role_id: str) -> Role:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM roles r WHERE r.id = $1", role_id)
    if row is None:
        raise RoleNotFound(f"Could not find role: {role_id}.")
    return Role.from_row(row)


async def find(conn: Connection, name_or_id: str) -> Role:
    """The role with this id, else the one with this name (in any case)."""
    row = await conn.fetchrow(
        f"""SELECT {_COLUMNS} FROM roles r WHERE r.id = $1
            UNION ALL SELECT {_COLUMNS} FROM roles r WHERE lower(r.name) = lower($1)""",
        name_or_id,
    )
    if row is None:
        raise RoleNotFound(f"no role has the name or id {name_or_id!r}")
    return Role.from_row(row)


async def list_roles(conn: Connection, *, name: str | None = None) -> list[Role]:
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM roles r
             WHERE ($1::text IS NULL OR r.name = $1) ORDER BY r.name""",
        name,
    )
    return [Role.from_row(row) for row in rows]


async def update(
    conn: Connection,
    role: Role,
    *,
    name: str | None = None,
    description: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Role:
    """Rename or redescribe a role; ``extra`` is merged into what it has."""
    try:
        row = await conn.fetchrow(
            f"""UPDATE roles r SET name = coalesce($2, r.name),
                       description = CASE WHEN $3::boolean THEN $4 ELSE r.description END,
                       extra = r.extra || $5::jsonb
                 WHERE r.id = $1 RETURNING {_COLUMNS}""",
            role.id,
            name,
            description is not None,
            description,
            extra or {},
        )
    except asyncpg.UniqueViolationError:
        raise _taken(str(name)) from None
    if row is None:
        raise RoleNotFound(f"Could not find role: {role.id}.")
    return Role.from_row(row)


async def delete(conn: Connection, role: Role) -> None:
    """Delete a role: its assignments go with it, and the tokens of everyone who held it
    in the projects they held it in (as a revoked grant takes them)."""
    async with conn.transaction():
        await conn.execute(
            """DELETE FROM identity_tokens t USING role_assignments a
                WHERE a.role_id = $1 AND t.user_id = a.user_id AND t.project_id = a.project_id""",
            role.id,
        )
        status = await conn.execute("DELETE FROM roles WHERE id = $1", role.id)
    if status == "DELETE 0":
        raise RoleNotFound(f"Could not find role: {role.id}.")


#: The roles a user has in a project: those assigned, and every role they imply.
EFFECTIVE_ROLES = f"""
WITH RECURSIVE granted(role_id) AS (
        SELECT a.role_id FROM role_assignments a WHERE a.user_id = $1 AND a.project_id = $2
    UNION
        SELECT i.implied_role_id FROM implied_roles i JOIN granted g ON i.prior_role_id = g.role_id
)
SELECT {_COLUMNS} FROM roles r JOIN granted g ON g.role_id = r.id ORDER BY r.name"""


def held_lateral(user_id: str, project_id: str) -> str:
    """A ``LATERAL`` subquery giving one column, ``roles``: what :data:`EFFECTIVE_ROLES`
    reads, as a JSON list of role objects ordered by name (NULL when none), for the user
    and project named by the SQL expressions ``user_id`` and ``project_id``.

    It lets the queries on the request path (a token's check, a login's scope) read the
    roles in the same round trip as the rows they belong to.
    """
    return f"""LATERAL (
        WITH RECURSIVE granted(role_id) AS (
                SELECT a.role_id FROM role_assignments a
                 WHERE a.user_id = {user_id} AND a.project_id = {project_id}
            UNION
                SELECT i.implied_role_id
                  FROM implied_roles i JOIN granted g ON i.prior_role_id = g.role_id
        )
        SELECT jsonb_agg(jsonb_build_object('id', r.id, 'name', r.name,
                                            'description', r.description, 'extra', r.extra)
                         ORDER BY r.name) AS roles
          FROM roles r JOIN granted g ON g.role_id = r.id
    ) held"""


async def effective(conn: Connection, user_id: str, project_id: str) -> list[Role]:
    """The roles the user has in the project, implied ones included; empty if none."""
    rows = await conn.fetch(EFFECTIVE_ROLES, user_id, project_id)
    return [Role.from_row(row) for row in rows]


async def implied_by(conn: Connection, role_ids: list[str]) -> dict[str, list[Role]]:
    """For each role, the roles it implies (directly or not)."""
    rows = await conn.fetch(
        f"""WITH RECURSIVE implied(prior, role_id) AS (
                    SELECT i.prior_role_id, i.implied_role_id FROM implied_roles i
                     WHERE i.prior_role_id = ANY($1::text[])
                UNION
                    SELECT d.prior, i.implied_role_id
                      FROM implied d JOIN implied_roles i ON i.prior_role_id = d.role_id
            )
            SELECT d.prior, {_COLUMNS} FROM implied d JOIN roles r ON r.id = d.role_id
             ORDER BY d.prior, r.name""",
        role_ids,
    )
    found: dict[str, list[Role]] = {role_id: [] for role_id in role_ids}
    for row in rows:
        found[row["prior"]].append(Role.from_row(row))
    return found
