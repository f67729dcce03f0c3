"""Security groups: each project's ``default`` group, the groups it creates, and which
servers are in which.

keel records groups and memberships and shows them; it filters no traffic (its guests
have no firewall). Every project has a ``default`` group that is not a row: its id is
derived from the project (:func:`default_group_id`), so it exists before anyone looks
and cannot be deleted. A server is in its project's default group unless
``instances_without_default_group`` names it (servers from before groups were recorded
are in it), and in each created group ``instance_security_groups`` pairs it with.

Every change is one statement that is a no-op when repeated (``ON CONFLICT DO
NOTHING``, ``DELETE``): the caller learns from its answer whether this call changed
anything, so two identical requests at once change the membership once, and one of
them is told "already". A group's delete locks its row; an addition's foreign key
takes a key-share lock on it, so the two never interleave: the delete sees the member
(409), or the addition finds no group.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from uuid import UUID

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import Conflict, KeelError
from shared.objects.base import KeelModel

LOG = logging.getLogger(__name__)

#: The name of the group every project has.
DEFAULT = "default"
_DEFAULT_IDS = uuid.UUID("6b2f3c1e-9d0a-4c55-8a3e-2f1d7c9b0e41")
#: What the default group shows as its age (it is not a row).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class GroupInUse(Conflict):
    """A live server is in the group: it cannot be deleted."""


class GroupNameRefused(KeelError):
    """A name a created group cannot have (``default``), or one matching several groups."""


def default_group_id(project_id: str) -> UUID:
    """The id of ``project_id``'s default group: stable, derived from the project."""
    return uuid.uuid5(_DEFAULT_IDS, f"security-group {project_id} {DEFAULT}")


class SecurityGroup(KeelModel):
    id: UUID
    project_id: str
    name: str
    description: str
    created_at: datetime
    updated_at: datetime

    @property
    def is_default(self) -> bool:
        return self.id == default_group_id(self.project_id)


def default_group(project_id: str) -> SecurityGroup:
    return SecurityGroup(
        id=default_group_id(project_id),
        project_id=project_id,
        name=DEFAULT,
        description="Default security group",
        created_at=_EPOCH,
        updated_at=_EPOCH,
    )


_COLUMNS = "id, project_id, name, description, created_at, updated_at"


async def list_created(conn: Connection, project_ids: Iterable[str] | None) -> list[SecurityGroup]:
    """The created groups of ``project_ids`` (of every project for ``None``), oldest first."""
    wanted = None if project_ids is None else sorted(set(project_ids))
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM security_groups
             WHERE $1::text[] IS NULL OR project_id = ANY($1::text[])
             ORDER BY created_at, id""",
        wanted,
    )
    return [SecurityGroup.from_row(row) for row in rows]


async def get_created(conn: Connection, group_id: UUID) -> SecurityGroup | None:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM security_groups WHERE id = $1", group_id)
    return None if row is None else SecurityGroup.from_row(row)


async def create(conn: Connection, project_id: str, name: str, description: str) -> SecurityGroup:
    if name == DEFAULT:
        raise GroupNameRefused("Default security group already exists.")
    row = await conn.fetchrow(
        f"""INSERT INTO security_groups (id, project_id, name, description)
            VALUES ($1, $2, $3, $4) RETURNING {_COLUMNS}""",
        uuid.uuid4(),
        project_id,
        name,
        description,
    )
    assert row is not None
    group = SecurityGroup.from_row(row)
    LOG.info(
        "project %s created security group %s (%s)",
        project_id,
        group.id,
        name,
        extra={"decision": "security_group_created"},
    )
    return group


async def update(
    conn: Connection, group_id: UUID, *, name: str | None, description: str | None
) -> SecurityGroup | None:
    if name == DEFAULT:
        raise GroupNameRefused("A security group other than the default cannot be named default.")
    row = await conn.fetchrow(
        f"""UPDATE security_groups
               SET name = coalesce($2, name), description = coalesce($3, description),
                   updated_at = now()
             WHERE id = $1 RETURNING {_COLUMNS}""",
        group_id,
        name,
        description,
    )
    return None if row is None else SecurityGroup.from_row(row)


async def delete(conn: Connection, group_id: UUID) -> bool:
    """Delete the created group; ``False`` if there is none. Raises :class:`GroupInUse`
    while a server that is not deleted is in it. Call in a transaction."""
    found = await conn.fetchval("SELECT id FROM security_groups WHERE id = $1 FOR UPDATE", group_id)
    if found is None:
        return False
    members = await conn.fetch(
        """SELECT m.instance_uuid FROM instance_security_groups m
             JOIN instances i ON i.uuid = m.instance_uuid
            WHERE m.group_id = $1 AND i.deleted_at IS NULL
            ORDER BY m.instance_uuid LIMIT 5""",
        group_id,
    )
    if members:
        servers = ", ".join(str(row["instance_uuid"]) for row in members)
        raise GroupInUse(
            f"Security Group {group_id} in use: servers are in it ({servers}); remove it "
            "from them first."
        )
    await conn.execute("DELETE FROM instance_security_groups WHERE group_id = $1", group_id)
    await conn.execute("DELETE FROM security_groups WHERE id = $1", group_id)
    LOG.info("deleted security group %s", group_id, extra={"decision": "security_group_deleted"})
    return True


async def find(conn: Connection, project_id: str, name_or_id: str) -> SecurityGroup | None:
    """The project's group named (or with the id) ``name_or_id``; ``None`` if none is.
    Raises :class:`GroupNameRefused` when several created groups have that name."""
    if name_or_id in (DEFAULT, str(default_group_id(project_id))):
        return default_group(project_id)
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM security_groups
             WHERE project_id = $1 AND (name = $2 OR id::text = $2)""",
        project_id,
        name_or_id,
    )
    if len(rows) > 1:
        raise GroupNameRefused(
            f"Multiple security groups named {name_or_id} exist: use the group's id."
        )
    return SecurityGroup.from_row(rows[0]) if rows else None


async def of_instances(
    conn: Connection, projects: Mapping[UUID, str]
) -> dict[UUID, list[SecurityGroup]]:
    """The groups each server (instance → its project) is in: its project's default
    group first when it is in it, then the created ones in the order they were added."""
    uuids = list(projects)
    outside = {
        row["instance_uuid"]
        for row in await conn.fetch(
            """SELECT instance_uuid FROM instances_without_default_group
                WHERE instance_uuid = ANY($1::uuid[])""",
            uuids,
        )
    }
    found: dict[UUID, list[SecurityGroup]] = {
        instance: ([] if instance in outside else [default_group(project)])
        for instance, project in projects.items()
    }
    rows = await conn.fetch(
        f"""SELECT m.instance_uuid, {", ".join("g." + c for c in _COLUMNS.split(", "))}
              FROM instance_security_groups m JOIN security_groups g ON g.id = m.group_id
             WHERE m.instance_uuid = ANY($1::uuid[])
             ORDER BY m.added_at, g.name""",
        uuids,
    )
    for row in rows:
        found[row["instance_uuid"]].append(SecurityGroup.from_row(row))
    return found


async def add(conn: Connection, instance_uuid: UUID, group: SecurityGroup) -> bool:
    """Put the server in the group; ``False`` when it already was (or the group is gone)."""
    if group.is_default:
        status = await conn.execute(
            "DELETE FROM instances_without_default_group WHERE instance_uuid = $1",
            instance_uuid,
        )
        return bool(status != "DELETE 0")
    try:
        async with conn.transaction():
            status = await conn.execute(
                """INSERT INTO instance_security_groups (instance_uuid, group_id)
                   VALUES ($1, $2) ON CONFLICT DO NOTHING""",
                instance_uuid,
                group.id,
            )
    except asyncpg.ForeignKeyViolationError:
        return False
    return bool(status != "INSERT 0 0")


async def remove(conn: Connection, instance_uuid: UUID, group: SecurityGroup) -> bool:
    """Take the server out of the group; ``False`` when it was not in it."""
    if group.is_default:
        status = await conn.execute(
            """INSERT INTO instances_without_default_group (instance_uuid) VALUES ($1)
               ON CONFLICT DO NOTHING""",
            instance_uuid,
        )
        return bool(status != "INSERT 0 0")
    status = await conn.execute(
        "DELETE FROM instance_security_groups WHERE instance_uuid = $1 AND group_id = $2",
        instance_uuid,
        group.id,
    )
    return bool(status != "DELETE 0")


async def record_created(
    conn: Connection, instance_uuid: UUID, groups: list[SecurityGroup]
) -> None:
    """A new server's groups as its create asked: in the default group only if named."""
    if not any(group.is_default for group in groups):
        await conn.execute(
            """INSERT INTO instances_without_default_group (instance_uuid) VALUES ($1)
               ON CONFLICT DO NOTHING""",
            instance_uuid,
        )
    for group in groups:
        if not group.is_default:
            await add(conn, instance_uuid, group)
