"""Queries on ``identity_tokens``: tokens issued by the identity API.

A token is stored only as its SHA-256 digest: tokens are long random strings, so a
fast hash is enough, and whoever reads the table cannot use what they read. A token is
valid while it has not expired, its user and project are enabled and the user still
holds a role in the project.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import asyncpg

from shared.db import projects, roles, users
from shared.db.pool import Connection
from shared.exceptions import UserNotFound
from shared.objects.identity import IssuedToken, Membership, Project, Role, User


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


async def issue(
    conn: Connection, token: str, membership: Membership, audit_id: str, expires_at: datetime
) -> IssuedToken:
    """Record ``token`` for the membership; expired tokens are purged on the way.

    One statement, so one round trip on every login. :class:`UserNotFound` if the user or
    the project was deleted meanwhile.
    """
    try:
        row = await conn.fetchrow(
            """WITH purged AS (DELETE FROM identity_tokens WHERE expires_at < now())
               INSERT INTO identity_tokens (token_hash, user_id, project_id, audit_id, expires_at)
               VALUES ($1, $2, $3, $4, $5) RETURNING issued_at, expires_at""",
            digest(token),
            membership.user.id,
            membership.project.id,
            audit_id,
            expires_at,
        )
    except asyncpg.ForeignKeyViolationError:
        raise UserNotFound(
            f"user {membership.user.id} or project {membership.project.id} was deleted"
        ) from None
    assert row is not None
    return IssuedToken(
        membership=membership,
        audit_id=audit_id,
        issued_at=row["issued_at"],
        expires_at=row["expires_at"],
    )


def _held(row: asyncpg.Record) -> tuple[Role, ...]:
    return tuple(Role.from_row(role) for role in row["roles"] or ())


async def find_valid(conn: Connection, token: str) -> IssuedToken | None:
    """What ``token`` stands for, or ``None`` if it is unknown, expired or revoked, or its
    user or project is disabled, or the user holds no role in the project any more.

    One round trip (the roles read with the token's row): every compute call pays it.
    """
    row = await conn.fetchrow(
        f"""SELECT t.audit_id, t.issued_at, t.expires_at,
                   u.id AS user_id, u.name AS user_name, u.default_project_id,
                   u.extra AS user_extra, u.created_at AS user_created_at,
                   u.password_changed_at,
                   p.id AS project_id, p.name AS project_name, p.description,
                   p.extra AS project_extra, p.created_at AS project_created_at, held.roles
              FROM identity_tokens t
              JOIN users u ON u.id = t.user_id AND u.enabled
              JOIN projects p ON p.id = t.project_id AND p.enabled
             CROSS JOIN {roles.held_lateral("t.user_id", "t.project_id")}
             WHERE t.token_hash = $1 AND t.expires_at > now()""",
        digest(token),
    )
    if row is None:
        return None
    held = _held(row)
    if not held:
        return None
    user = User(
        id=row["user_id"],
        name=row["user_name"],
        default_project_id=row["default_project_id"],
        extra=row["user_extra"],
        created_at=row["user_created_at"],
        password_changed_at=row["password_changed_at"],
    )
    project = Project(
        id=row["project_id"],
        name=row["project_name"],
        description=row["description"],
        extra=row["project_extra"],
        created_at=row["project_created_at"],
    )
    return IssuedToken(
        membership=Membership(user=user, project=project, roles=held),
        audit_id=row["audit_id"],
        issued_at=row["issued_at"],
        expires_at=row["expires_at"],
    )


async def membership_in(
    conn: Connection, user: User, project: str, *, by_name: bool = False
) -> Membership | None:
    """``user``'s roles in the project with id ``project`` (``by_name``: with that id,
    else with that name), read with the project in one round trip; ``None`` if there is
    no such project or the user holds no role in it. The project may be disabled: the
    caller says so."""
    row = await conn.fetchrow(
        f"""WITH chosen AS (
                    SELECT p.id, p.name, p.description, p.enabled, p.extra, p.created_at,
                           0 AS rank
                      FROM projects p WHERE p.id = $2
                UNION ALL
                    SELECT p.id, p.name, p.description, p.enabled, p.extra, p.created_at,
                           1 AS rank
                      FROM projects p WHERE $3::boolean AND p.name = $2
                ORDER BY rank LIMIT 1
            )
            SELECT c.*, held.roles FROM chosen c CROSS JOIN {roles.held_lateral("$1", "c.id")}""",
        user.id,
        project,
        by_name,
    )
    if row is None:
        return None
    held = _held(row)
    if not held:
        return None
    return Membership(user=user, project=Project.from_row(row), roles=held)


async def membership_of(conn: Connection, user_id: str, project_id: str) -> Membership | None:
    """The user's roles in the project, or ``None`` if they hold none there."""
    held = await roles.effective(conn, user_id, project_id)
    if not held:
        return None
    return Membership(
        user=await users.get(conn, user_id),
        project=await projects.get(conn, project_id),
        roles=tuple(held),
    )


async def revoke(conn: Connection, token: str) -> bool:
    """Forget ``token``; False if it was not known."""
    status = await conn.execute("DELETE FROM identity_tokens WHERE token_hash = $1", digest(token))
    return status != "DELETE 0"
