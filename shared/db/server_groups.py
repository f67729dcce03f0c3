"""Queries on ``server_groups`` and ``server_group_members``.

Members are read joined with live instances: a deleted server has left its group. A
server joins a group in the transaction that creates it, after :func:`lock_group`, so
the member count checked against the ``server_group_members`` quota still holds at
commit. The same lock serialises the scheduler's placements of one group's members
(:func:`placement`): each reads where the others hold claims and claims in one
transaction, so two members of an anti-affinity group never both take one host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from shared.db.pool import Connection
from shared.exceptions import ServerGroupNotFound
from shared.objects.server_group import GroupPlacement, ServerGroup

#: First key of the two-key advisory lock held while a group's members join or are placed.
_LOCK_CLASS = 0x73677270  # "sgrp"

_MEMBERS = """
    coalesce((SELECT array_agg(m.instance_uuid ORDER BY m.created_at, m.instance_uuid)
                FROM server_group_members m JOIN instances i ON i.uuid = m.instance_uuid
               WHERE m.group_id = g.id AND i.deleted_at IS NULL), '{}') AS members"""


def _group(row: Any) -> ServerGroup:
    return ServerGroup.model_validate(dict(row))


async def lock_group(conn: Connection, group_uuid: UUID) -> None:
    """Serialise, until the transaction ends, joins to and placements in one group."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, str(group_uuid)
    )


async def create(
    conn: Connection,
    *,
    group_uuid: UUID,
    name: str,
    project_id: str,
    user_id: str,
    policy: str,
    rules: dict[str, Any],
) -> ServerGroup:
    row = await conn.fetchrow(
        """WITH g AS (
                INSERT INTO server_groups (uuid, name, project_id, user_id, policy, rules)
                VALUES ($1, $2, $3, $4, $5, $6::jsonb) RETURNING *)
            SELECT g.*, '{}'::uuid[] AS members FROM g""",
        group_uuid,
        name,
        project_id,
        user_id,
        policy,
        rules,
    )
    assert row is not None
    return _group(row)


async def get(conn: Connection, group_uuid: UUID) -> ServerGroup:
    row = await conn.fetchrow(
        f"SELECT g.*, {_MEMBERS} FROM server_groups g WHERE g.uuid = $1", group_uuid
    )
    if row is None:
        raise ServerGroupNotFound(f"Instance group {group_uuid} could not be found.")
    return _group(row)


async def list_groups(
    conn: Connection, project_id: str | None, *, limit: int | None, offset: int
) -> list[ServerGroup]:
    """One project's groups (every project's with ``None``), oldest first."""
    rows = await conn.fetch(
        f"""SELECT g.*, {_MEMBERS} FROM server_groups g
             WHERE $1::text IS NULL OR g.project_id = $1
             ORDER BY g.id LIMIT $2 OFFSET $3""",
        project_id,
        limit,
        offset,
    )
    return [_group(row) for row in rows]


async def delete(conn: Connection, group_uuid: UUID) -> None:
    status = await conn.execute("DELETE FROM server_groups WHERE uuid = $1", group_uuid)
    if status == "DELETE 0":
        raise ServerGroupNotFound(f"Instance group {group_uuid} could not be found.")


async def count(conn: Connection, project_id: str) -> int:
    found: int = await conn.fetchval(
        "SELECT count(*) FROM server_groups WHERE project_id = $1", project_id
    )
    return found


async def add_members(conn: Connection, group_id: int, instance_uuids: Sequence[UUID]) -> None:
    await conn.executemany(
        "INSERT INTO server_group_members (group_id, instance_uuid) VALUES ($1, $2)",
        [(group_id, instance_uuid) for instance_uuid in instance_uuids],
    )


async def of_instances(conn: Connection, instance_uuids: Sequence[UUID]) -> dict[UUID, UUID]:
    """Instance → the group it is in, for those of ``instance_uuids`` in one."""
    rows = await conn.fetch(
        """SELECT m.instance_uuid, g.uuid FROM server_group_members m
             JOIN server_groups g ON g.id = m.group_id
            WHERE m.instance_uuid = ANY($1::uuid[])""",
        list(instance_uuids),
    )
    return {row["instance_uuid"]: row["uuid"] for row in rows}


async def placement(conn: Connection, instance_uuid: UUID) -> GroupPlacement | None:
    """The group of ``instance_uuid`` and where its other members hold claims; ``None``
    when it is in no group. Takes the group's lock (held until the transaction ends)."""
    row = await conn.fetchrow(
        """SELECT g.* FROM server_groups g JOIN server_group_members m ON m.group_id = g.id
            WHERE m.instance_uuid = $1""",
        instance_uuid,
    )
    if row is None:
        return None
    group = _group({**dict(row), "members": []})
    await lock_group(conn, group.uuid)
    return await members_placed(conn, group, leaving_out=instance_uuid)


async def members_placed(
    conn: Connection, group: ServerGroup, *, leaving_out: UUID | None = None
) -> GroupPlacement:
    """Where the group's live members (but ``leaving_out``) hold claims, host by host."""
    rows = await conn.fetch(
        """SELECT DISTINCT n.service_id, s.host, a.instance_uuid
             FROM server_group_members m
             JOIN instances i ON i.uuid = m.instance_uuid AND i.deleted_at IS NULL
             JOIN allocations a ON a.instance_uuid = m.instance_uuid
             JOIN compute_nodes n ON n.id = a.compute_node_id
             JOIN services s ON s.id = n.service_id
            WHERE m.group_id = $1 AND m.instance_uuid IS DISTINCT FROM $2
            ORDER BY n.service_id, a.instance_uuid""",
        group.id,
        leaving_out,
    )
    by_service: dict[int, list[UUID]] = {}
    hosts: dict[int, str] = {}
    for row in rows:
        by_service.setdefault(row["service_id"], []).append(row["instance_uuid"])
        hosts[row["service_id"]] = row["host"]
    return GroupPlacement(
        uuid=group.uuid,
        name=group.name,
        policy=group.policy,
        max_server_per_host=group.max_server_per_host,
        members_by_service=by_service,
        hosts=hosts,
    )
