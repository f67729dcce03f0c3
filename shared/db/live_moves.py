"""Queries on ``migrations`` that only live migrations need: progress, force-complete,
and the list of a server's live migrations in progress (``GET /servers/{id}/migrations``).
"""

from __future__ import annotations

from uuid import UUID

from shared.db import allocations, instance_actions, instances, moves
from shared.db.pool import Connection
from shared.objects.migration import LIVE_MIGRATION, Migration
from shared.objects.states import TaskState

#: The statuses of a live migration in progress, as Nova lists them under a server.
IN_PROGRESS = ("accepted", "preparing", "running", "post-migrating")


async def in_progress(
    conn: Connection, instance_uuid: UUID, migration_id: int | None = None
) -> list[Migration]:
    """The server's live migrations in progress (only ``migration_id``, if given)."""
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE instance_uuid = $1 AND migration_type = 'live-migration'
              AND status = ANY($2::text[]) AND deleted_at IS NULL
              AND ($3::bigint IS NULL OR id = $3)
            ORDER BY id""",
        instance_uuid,
        list(IN_PROGRESS),
        migration_id,
    )
    return [Migration.from_row(row) for row in rows]


async def find(conn: Connection, instance_uuid: UUID, migration_id: int) -> Migration | None:
    """The server's live migration ``migration_id``, whatever its status."""
    row = await conn.fetchrow(
        """SELECT * FROM migrations
            WHERE instance_uuid = $1 AND id = $2 AND migration_type = 'live-migration'
              AND deleted_at IS NULL""",
        instance_uuid,
        migration_id,
    )
    return None if row is None else Migration.from_row(row)


async def ask_force_complete(conn: Connection, migration_uuid: UUID) -> Migration | None:
    """Mark a ``running`` live migration to finish its copy now; ``None`` if not running."""
    row = await conn.fetchrow(
        """UPDATE migrations SET force_complete = true, updated_at = now()
            WHERE uuid = $1 AND status = 'running' AND deleted_at IS NULL
        RETURNING *""",
        migration_uuid,
    )
    return None if row is None else Migration.from_row(row)


async def record_progress(
    conn: Connection,
    migration_uuid: UUID,
    *,
    memory_total: int,
    memory_processed: int,
    disk_total: int,
    disk_processed: int,
) -> Migration | None:
    """Record a ``running`` live migration's progress; the record (whatever its status),
    ``None`` if it does not exist."""
    row = await conn.fetchrow(
        """UPDATE migrations
              SET memory_total_bytes = $2::bigint, memory_processed_bytes = $3::bigint,
                  memory_remaining_bytes = $2::bigint - $3::bigint,
                  disk_total_bytes = $4::bigint, disk_processed_bytes = $5::bigint,
                  disk_remaining_bytes = $4::bigint - $5::bigint, updated_at = now()
            WHERE uuid = $1 AND status = 'running' AND deleted_at IS NULL
        RETURNING *""",
        migration_uuid,
        memory_total,
        memory_processed,
        disk_total,
        disk_processed,
    )
    if row is None:
        row = await conn.fetchrow("SELECT * FROM migrations WHERE uuid = $1", migration_uuid)
    return None if row is None else Migration.from_row(row)


async def end_in(
    conn: Connection, migration_uuid: UUID, expected: tuple[str, ...], status: str, message: str
) -> Migration | None:
    """End a live migration as ``status`` with the server on its source, as it was: the
    record, its claim, the task and the instance action, in the caller's transaction.
    ``None`` if the record was no longer in one of ``expected`` (nothing written)."""
    await moves.lock(conn, migration_uuid)
    ended = await moves.swap_status(conn, migration_uuid, expected=list(expected), new=status)
    if ended is None:
        return None
    await allocations.release_consumer(conn, migration_uuid)
    await instances.finish_task(conn, ended.instance_uuid, (TaskState.MIGRATING,))
    await instance_actions.finish(conn, ended.instance_uuid, LIVE_MIGRATION.action, message)
    return ended
