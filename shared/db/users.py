"""Queries on ``users``.

The password hash is written here and read only by :func:`password_hash`; every other
query returns users without it. A user whose password changes, who is disabled or who is
deleted loses every token issued to them, in the same transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from shared.db import role_assignments, roles
from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, ProjectNotFound, UserNotFound
from shared.objects.identity import MEMBER_ROLE, Project, User, UserChanges

_USER_COLUMNS = (
    "u.id, u.name, u.default_project_id, u.enabled, u.extra, u.created_at, u.password_changed_at"
)


def _taken(name: str) -> AlreadyExists:
    return AlreadyExists(f"a user named {name!r} already exists")


def _no_project(project_id: str | None) -> ProjectNotFound:
    return ProjectNotFound(f"Could not find project: {project_id}.")


async def create(
    conn: Connection,
    name: str,
    password_hash: str | None,
    *,
    default_project_id: str | None = None,
    enabled: bool = True,
    extra: dict[str, Any] | None = None,
) -> User:
    """A new user (without a password when ``password_hash`` is None); no roles yet."""
    try:
        row = await conn.fetchrow(
            f"""INSERT INTO users AS u (id, name, password_hash, default_project_id, enabled, extra)
                VALUES ($1, $2, $3, $4, $5, $6) RETURNING {_USER_COLUMNS}""",
            uuid.uuid4().hex,
            name,
            password_hash,
            default_project_id,
            enabled,
            extra or {},
        )
    except asyncpg.UniqueViolationError:
        raise _taken(name) from None
    except asyncpg.ForeignKeyViolationError:
        raise _no_project(default_project_id) from None
    assert row is not None
    return User.from_row(row)


async def create_in_project(
    conn: Connection,
    name: str,
    password_hash: str | None,
    project: Project,
    role: str = MEMBER_ROLE,
) -> User:
    """A new user whose default project is ``project``, holding ``role`` (name or id) there."""
    given = await roles.find(conn, role)
    async with conn.transaction():
        user = await create(conn, name, password_hash, default_project_id=project.id)
        await role_assignments.grant(conn, user.id, project.id, given.id)
    return user


async def get(conn: Connection, user_id: str) -> User:
    row = await conn.fetchrow(f"SELECT {_USER_COLUMNS} FROM users u WHERE u.id = $1", user_id)
    if row is None:
        raise UserNotFound(f"Could not find user: {user_id}.")
    return User.from_row(row)


async def find(conn: Connection, name_or_id: str) -> User:
    """The user with this id, else the one with this name."""
    row = await conn.fetchrow(
        f"""SELECT {_USER_COLUMNS} FROM users u WHERE u.id = $1
            UNION ALL SELECT {_USER_COLUMNS} FROM users u WHERE u.name = $1""",
        name_or_id,
    )
    if row is None:
        raise UserNotFound(f"no user has the name or id {name_or_id!r}")
    return User.from_row(row)


async def list_users(
    conn: Connection, *, name: str | None = None, enabled: bool | None = None
) -> list[User]:
    rows = await conn.fetch(
        f"""SELECT {_USER_COLUMNS} FROM users u
             WHERE ($1::text IS NULL OR u.name = $1) AND ($2::boolean IS NULL OR u.enabled = $2)
             ORDER BY u.name""",
        name,
        enabled,
    )
    return [User.from_row(row) for row in rows]


async def password_hash(
    conn: Connection, *, user_id: str | None, name: str | None
) -> tuple[User, str | None] | None:
    """The user (by id, or by name) and their stored hash; ``None`` if there is none."""
    row = await conn.fetchrow(
        f"""SELECT {_USER_COLUMNS}, u.password_hash FROM users u
             WHERE ($1::text IS NOT NULL AND u.id = $1) OR ($1::text IS NULL AND u.name = $2)""",
        user_id,
        name,
    )
    if row is None:
        return None
    return User.from_row(row), row["password_hash"]


async def _revoke_tokens(conn: Connection, user_id: str) -> None:
    await conn.execute("DELETE FROM identity_tokens WHERE user_id = $1", user_id)


async def set_password(conn: Connection, user: User, new_hash: str) -> None:
    """Replace the password and revoke every token issued with the old one."""
    await update(conn, user.id, UserChanges(password_hash=new_hash))


async def update(conn: Connection, user_id: str, changes: UserChanges) -> User:
    """Apply the fields ``changes`` was given; a new password or disabling revokes the
    user's tokens."""
    given = changes.model_fields_set
    async with conn.transaction():
        try:
            row = await conn.fetchrow(
                f"""UPDATE users u SET
                           name = coalesce($2, u.name),
                           password_hash = CASE WHEN $3::boolean THEN $4 ELSE u.password_hash END,
                           password_changed_at = CASE WHEN $3::boolean THEN now()
                                                      ELSE u.password_changed_at END,
                           enabled = coalesce($5, u.enabled),
                           default_project_id = CASE WHEN $6::boolean THEN $7
                                                     ELSE u.default_project_id END,
                           extra = u.extra || $8::jsonb
                     WHERE u.id = $1 RETURNING {_USER_COLUMNS}""",
                user_id,
                changes.name,
                "password_hash" in given,
                changes.password_hash,
                changes.enabled,
                "default_project_id" in given,
                changes.default_project_id,
                changes.extra or {},
            )
        except asyncpg.UniqueViolationError:
            raise _taken(str(changes.name)) from None
        except asyncpg.ForeignKeyViolationError:
            raise _no_project(changes.default_project_id) from None
        if row is None:
            raise UserNotFound(f"Could not find user: {user_id}.")
        if "password_hash" in given or changes.enabled is False:
            await _revoke_tokens(conn, user_id)
    return User.from_row(row)


async def delete(conn: Connection, user: User) -> None:
    """Delete the user; their roles and tokens go with them."""
    status = await conn.execute("DELETE FROM users WHERE id = $1", user.id)
    if status == "DELETE 0":
        raise UserNotFound(f"Could not find user: {user.id}.")


async def projects_of(
    conn: Connection, user_id: str, *, enabled_only: bool = False
) -> list[Project]:
    """The projects the user holds a role in (only enabled ones if asked), by name."""
    rows = await conn.fetch(
        """SELECT DISTINCT p.* FROM projects p JOIN role_assignments a ON a.project_id = p.id
            WHERE a.user_id = $1 AND (NOT $2::boolean OR p.enabled) ORDER BY p.name""",
        user_id,
        enabled_only,
    )
    return [Project.from_row(row) for row in rows]
