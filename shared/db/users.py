"""Queries on ``users`` and ``role_assignments``.

The password hash is written here and read only by :func:`password_hash`; every other
query returns users without it.
"""

from __future__ import annotations

import uuid

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import AlreadyExists, UserNotFound
from shared.objects.identity import Membership, Project, Role, User

_USER_COLUMNS = "u.id, u.name, u.default_project_id, u.created_at, u.password_changed_at"


async def create(
    conn: Connection, name: str, password_hash: str, project: Project, role: Role
) -> User:
    """A new user holding ``role`` in ``project`` (their default project)."""
    async with conn.transaction():
        try:
            row = await conn.fetchrow(
                f"""INSERT INTO users AS u (id, name, password_hash, default_project_id)
                    VALUES ($1, $2, $3, $4) RETURNING {_USER_COLUMNS}""",
                uuid.uuid4().hex,
                name,
                password_hash,
                project.id,
            )
        except asyncpg.UniqueViolationError:
            raise AlreadyExists(f"a user named {name!r} already exists") from None
        assert row is not None
        user = User.from_row(row)
        await conn.execute(
            "INSERT INTO role_assignments (user_id, project_id, role) VALUES ($1, $2, $3)",
            user.id,
            project.id,
            role.value,
        )
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


async def list_users(conn: Connection, *, name: str | None = None) -> list[User]:
    rows = await conn.fetch(
        f"""SELECT {_USER_COLUMNS} FROM users u
             WHERE ($1::text IS NULL OR u.name = $1) ORDER BY u.name""",
        name,
    )
    return [User.from_row(row) for row in rows]


async def password_hash(
    conn: Connection, *, user_id: str | None, name: str | None
) -> tuple[User, str] | None:
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


async def set_password(conn: Connection, user: User, new_hash: str) -> None:
    """Replace the password and revoke every token issued with the old one."""
    async with conn.transaction():
        await conn.execute(
            "UPDATE users SET password_hash = $2, password_changed_at = now() WHERE id = $1",
            user.id,
            new_hash,
        )
        await conn.execute("DELETE FROM identity_tokens WHERE user_id = $1", user.id)


async def delete(conn: Connection, user: User) -> None:
    """Delete the user; their roles and tokens go with them."""
    await conn.execute("DELETE FROM users WHERE id = $1", user.id)


def _membership(row: asyncpg.Record) -> Membership:
    user = User(
        id=row["user_id"],
        name=row["user_name"],
        default_project_id=row["default_project_id"],
        created_at=row["user_created_at"],
        password_changed_at=row["password_changed_at"],
    )
    project = Project(
        id=row["project_id"],
        name=row["project_name"],
        description=row["description"],
        created_at=row["project_created_at"],
    )
    return Membership(user=user, project=project, role=Role(row["role"]))


#: The columns :func:`membership_from_row` reads, and the joins they come from.
MEMBERSHIP_COLUMNS = """u.id AS user_id, u.name AS user_name, u.default_project_id,
       u.created_at AS user_created_at, u.password_changed_at,
       p.id AS project_id, p.name AS project_name, p.description,
       p.created_at AS project_created_at, r.role"""
MEMBERSHIP_FROM = """FROM role_assignments r
      JOIN users u ON u.id = r.user_id
      JOIN projects p ON p.id = r.project_id"""
MEMBERSHIP_SELECT = f"SELECT {MEMBERSHIP_COLUMNS} {MEMBERSHIP_FROM}"


def membership_from_row(row: asyncpg.Record) -> Membership:
    return _membership(row)


async def membership(conn: Connection, user_id: str, project_id: str) -> Membership | None:
    """The user's role in the project, or ``None`` if they have none there."""
    row = await conn.fetchrow(
        MEMBERSHIP_SELECT + " WHERE r.user_id = $1 AND r.project_id = $2", user_id, project_id
    )
    return None if row is None else _membership(row)


async def memberships(
    conn: Connection, *, user_id: str | None = None, project_id: str | None = None
) -> list[Membership]:
    rows = await conn.fetch(
        MEMBERSHIP_SELECT
        + """ WHERE ($1::text IS NULL OR r.user_id = $1)
                AND ($2::text IS NULL OR r.project_id = $2)
              ORDER BY u.name, p.name""",
        user_id,
        project_id,
    )
    return [_membership(row) for row in rows]
