"""Read-only queries of the operator's page (:mod:`services.api.ops`): the fleet at a glance.

How many servers each compute node holds and in which state, the servers of one host,
the moves not yet ended with how long each has waited, and the recent evacuations and
automatic recoveries. Ages are measured by the database's clock, so the page never
compares its own clock with a server's. Every list is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from shared.db.pool import Connection

#: Move statuses that are not an end: the move, or its clean-up, still has work to do.
#: ``done`` (an evacuation waiting for its source host to remove the old copy) and
#: ``finished`` (a cold migration waiting for its confirm or revert) included, and a
#: live migration's ``preparing``, ``running`` and ``post-migrating``.
OPEN_STATUSES = (
    "accepted",
    "pre-migrating",
    "done",
    "finished",
    "confirming",
    "reverting",
    "preparing",
    "running",
    "post-migrating",
)


@dataclass(frozen=True)
class ServerOnHost:
    uuid: UUID
    name: str
    project_id: str
    vm_state: str
    task_state: str | None
    power_state: int
    #: The compute node it is on.
    compute_id: int


@dataclass(frozen=True)
class OpenMove:
    uuid: UUID
    migration_type: str
    status: str
    instance_uuid: UUID
    server_name: str | None
    source: str | None
    dest: str | None
    user_id: str | None
    #: The name of the user who asked, when the identity API knows them.
    user_name: str | None
    created_at: datetime
    #: Seconds since the move was asked for.
    age: float
    #: Seconds since its record last changed (what a move's deadline counts).
    idle: float


@dataclass(frozen=True)
class Recovery:
    """A fenced host whose servers the conductors started evacuating on their own."""

    host: str
    started_at: datetime
    age: float
    evacuations: int
    skipped: int


async def server_counts(conn: Connection) -> dict[int, dict[str, int]]:
    """Compute node id → vm state → how many live servers are placed on it."""
    rows = await conn.fetch(
        """SELECT compute_id, vm_state, count(*) AS n FROM instances
            WHERE deleted_at IS NULL AND compute_id IS NOT NULL
            GROUP BY compute_id, vm_state"""
    )
    counts: dict[int, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row["compute_id"], {})[row["vm_state"]] = row["n"]
    return counts


async def servers_on(conn: Connection, node_ids: list[int], *, limit: int) -> list[ServerOnHost]:
    """The live servers on these compute nodes, oldest first, at most ``limit``."""
    rows = await conn.fetch(
        """SELECT uuid, display_name, project_id, vm_state, task_state, power_state, compute_id
             FROM instances
            WHERE compute_id = ANY($1::bigint[]) AND deleted_at IS NULL
            ORDER BY id LIMIT $2""",
        node_ids,
        limit,
    )
    return [
        ServerOnHost(
            uuid=row["uuid"],
            name=row["display_name"],
            project_id=row["project_id"],
            vm_state=row["vm_state"],
            task_state=row["task_state"],
            power_state=row["power_state"],
            compute_id=row["compute_id"],
        )
        for row in rows
    ]


def _move(row: asyncpg.Record) -> OpenMove:
    return OpenMove(
        uuid=row["uuid"],
        migration_type=row["migration_type"],
        status=row["status"],
        instance_uuid=row["instance_uuid"],
        server_name=row["display_name"],
        source=row["source_compute"],
        dest=row["dest_compute"],
        user_id=row["user_id"],
        user_name=row["user_name"],
        created_at=row["created_at"],
        age=row["age"],
        idle=row["idle"],
    )


_MOVE_COLUMNS = """m.uuid, m.migration_type, m.status, m.instance_uuid, i.display_name,
       m.source_compute, m.dest_compute, m.user_id, u.name AS user_name, m.created_at,
       EXTRACT(EPOCH FROM now() - m.created_at)::float8 AS age,
       EXTRACT(EPOCH FROM now() - COALESCE(m.updated_at, m.created_at))::float8 AS idle
  FROM migrations m LEFT JOIN instances i ON i.uuid = m.instance_uuid
  LEFT JOIN users u ON u.id = m.user_id"""


async def open_moves(conn: Connection, *, limit: int) -> list[OpenMove]:
    """Moves in one of :data:`OPEN_STATUSES`, newest first, at most ``limit``."""
    rows = await conn.fetch(
        f"""SELECT {_MOVE_COLUMNS}
             WHERE m.deleted_at IS NULL AND m.status = ANY($1::text[])
             ORDER BY m.id DESC LIMIT $2""",
        list(OPEN_STATUSES),
        limit,
    )
    return [_move(row) for row in rows]


async def recent_evacuations(conn: Connection, *, limit: int) -> list[OpenMove]:
    """The latest evacuations, whatever their status, newest first."""
    rows = await conn.fetch(
        f"""SELECT {_MOVE_COLUMNS}
             WHERE m.deleted_at IS NULL AND m.migration_type = 'evacuation'
             ORDER BY m.id DESC LIMIT $1""",
        limit,
    )
    return [_move(row) for row in rows]


async def recent_recoveries(conn: Connection, *, limit: int) -> list[Recovery]:
    """The latest hosts the conductors evacuated automatically, newest first."""
    rows = await conn.fetch(
        """SELECT host, started_at, evacuations, skipped,
                  EXTRACT(EPOCH FROM now() - started_at)::float8 AS age
             FROM host_recoveries ORDER BY id DESC LIMIT $1""",
        limit,
    )
    return [
        Recovery(
            host=row["host"],
            started_at=row["started_at"],
            age=row["age"],
            evacuations=row["evacuations"],
            skipped=row["skipped"],
        )
        for row in rows
    ]


async def server_states(conn: Connection) -> list[tuple[str, str | None, int]]:
    """(vm state, task state, how many live servers are in it)."""
    rows = await conn.fetch(
        """SELECT vm_state, task_state, count(*) AS n FROM instances
            WHERE deleted_at IS NULL GROUP BY vm_state, task_state"""
    )
    return [(row["vm_state"], row["task_state"], row["n"]) for row in rows]


async def move_counts(conn: Connection, *, ended_within: float) -> list[tuple[str, str, int]]:
    """(type, status, how many): every move not yet ended, and those that ended (their
    record last changed) within the last ``ended_within`` seconds."""
    rows = await conn.fetch(
        """SELECT migration_type, status, count(*) AS n FROM migrations
            WHERE deleted_at IS NULL
              AND (status = ANY($1::text[])
                   OR COALESCE(updated_at, created_at) > now() - make_interval(secs => $2))
            GROUP BY migration_type, status""",
        list(OPEN_STATUSES),
        ended_within,
    )
    return [(row["migration_type"], row["status"], row["n"]) for row in rows]
