"""Queries on ``migrations``: the record of every evacuation and cold migration.

Status changes are compare-and-swaps on the status expected, like the instance's: a
twin delivery of the same step finds the record already moved on and does nothing.

**Lock order.** A transaction that changes an instance and its move record (and their
claims) takes the row locks in one order: the instance, then the migration, then the
allocations. :func:`lock` takes the first two at the start of such a transaction, so
two concurrent steps of one move queue behind each other instead of deadlocking.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from shared.context import RequestContext
from shared.db.pool import Connection
from shared.exceptions import NotFound
from shared.objects.compute_node import ComputeNode
from shared.objects.flavor import FlavorSnapshot
from shared.objects.migration import Migration


async def create(
    conn: Connection,
    ctx: RequestContext,
    *,
    instance_uuid: UUID,
    migration_type: str,
    status: str,
    source: ComputeNode | None,
    dest_host: str | None = None,
    old_flavor: FlavorSnapshot | None = None,
    new_flavor: FlavorSnapshot | None = None,
    end_stopped: bool = False,
    forced: bool = False,
) -> Migration:
    row = await conn.fetchrow(
        """INSERT INTO migrations (uuid, instance_uuid, migration_type, status,
                                   source_compute, source_node, source_compute_id,
                                   dest_host, user_id, project_id, updated_at,
                                   old_flavor, new_flavor, source_token, end_stopped, forced)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now(), $11, $12,
                   (SELECT copy_token FROM instances WHERE uuid = $2), $13, $14)
        RETURNING *""",
        uuid.uuid4(),
        instance_uuid,
        migration_type,
        status,
        None if source is None else source.host,
        None if source is None else source.hypervisor_hostname,
        None if source is None else source.id,
        dest_host,
        ctx.user_id,
        ctx.project_id,
        None if old_flavor is None else old_flavor.model_dump(mode="json"),
        None if new_flavor is None else new_flavor.model_dump(mode="json"),
        end_stopped,
        forced,
    )
    assert row is not None
    return Migration.from_row(row)


async def lock(conn: Connection, migration_uuid: UUID) -> Migration:
    """Lock the move's instance row, then its record (the documented order); the record.

    Call inside a transaction, before changing either.
    """
    await conn.execute(
        """SELECT 1 FROM instances
            WHERE uuid = (SELECT instance_uuid FROM migrations WHERE uuid = $1)
              FOR UPDATE""",
        migration_uuid,
    )
    row = await conn.fetchrow("SELECT * FROM migrations WHERE uuid = $1 FOR UPDATE", migration_uuid)
    if row is None:
        raise NotFound(f"Migration {migration_uuid} could not be found.")
    return Migration.from_row(row)


async def get(conn: Connection, migration_uuid: UUID) -> Migration:
    row = await conn.fetchrow("SELECT * FROM migrations WHERE uuid = $1", migration_uuid)
    if row is None:
        raise NotFound(f"Migration {migration_uuid} could not be found.")
    return Migration.from_row(row)


async def swap_status(
    conn: Connection,
    migration_uuid: UUID,
    *,
    expected: Sequence[str],
    new: str,
    dest: ComputeNode | None = None,
    only_untaken: bool = False,
) -> Migration | None:
    """``expected`` → ``new`` (recording the destination if given); ``None`` if lost.

    ``only_untaken``: lost as well once a conductor has acted on the move (it holds a
    claim for it), so that a withdrawal never ends a move already under way.
    """
    untaken = (
        "AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.consumer_uuid = migrations.uuid)"
        if only_untaken
        else ""
    )
    row = await conn.fetchrow(
        f"""UPDATE migrations
              SET status = $3, updated_at = now(),
                  dest_compute = COALESCE($4, dest_compute),
                  dest_node = COALESCE($5, dest_node),
                  dest_compute_id = COALESCE($6, dest_compute_id)
            WHERE uuid = $1 AND status = ANY($2::text[]) AND deleted_at IS NULL {untaken}
        RETURNING *""",
        migration_uuid,
        list(expected),
        new,
        None if dest is None else dest.host,
        None if dest is None else dest.hypervisor_hostname,
        None if dest is None else dest.id,
    )
    return None if row is None else Migration.from_row(row)


async def from_source(
    conn: Connection, node_id: int, migration_type: str, statuses: Sequence[str]
) -> list[Migration]:
    """Moves away from node ``node_id`` in one of ``statuses``, oldest first."""
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE source_compute_id = $1 AND migration_type = $2
              AND status = ANY($3::text[]) AND deleted_at IS NULL
            ORDER BY id""",
        node_id,
        migration_type,
        list(statuses),
    )
    return [Migration.from_row(row) for row in rows]


async def unconfirmed_evacuations(conn: Connection, service_id: int) -> list[Migration]:
    """Evacuations away from the service's nodes that are ``done`` but not confirmed."""
    rows = await conn.fetch(
        """SELECT m.* FROM migrations m JOIN compute_nodes n ON n.id = m.source_compute_id
            WHERE n.service_id = $1 AND m.migration_type = 'evacuation'
              AND m.status = 'done' AND m.deleted_at IS NULL
            ORDER BY m.id""",
        service_id,
    )
    return [Migration.from_row(row) for row in rows]


async def unconfirmed_moves(conn: Connection, older_than: float) -> list[Migration]:
    """Cold migrations and resizes ``finished`` (awaiting confirm or revert) for
    ``older_than`` seconds."""
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE migration_type IN ('migration', 'resize') AND status = 'finished'
              AND deleted_at IS NULL AND updated_at < now() - make_interval(secs => $1)
            ORDER BY id""",
        older_than,
    )
    return [Migration.from_row(row) for row in rows]


async def stalled_endings(conn: Connection, older_than: float) -> list[Migration]:
    """Cold migrations and resizes ``confirming`` or ``reverting`` unchanged for
    ``older_than`` seconds."""
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE migration_type IN ('migration', 'resize')
              AND status IN ('confirming', 'reverting')
              AND deleted_at IS NULL AND updated_at < now() - make_interval(secs => $1)
            ORDER BY id""",
        older_than,
    )
    return [Migration.from_row(row) for row in rows]


async def older_than(
    conn: Connection, statuses: Sequence[str], seconds: float, *, batch: int = 100
) -> list[Migration]:
    """Moves in one of ``statuses`` whose record has not changed for ``seconds``."""
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE status = ANY($1::text[]) AND deleted_at IS NULL
              AND COALESCE(updated_at, created_at) < now() - make_interval(secs => $2)
            ORDER BY id LIMIT $3""",
        list(statuses),
        seconds,
        batch,
    )
    return [Migration.from_row(row) for row in rows]


#: Statuses a move is cancelled from when its server is deleted (a ``finished`` cold
#: migration ends ``confirmed`` instead, as Nova's delete of a resized server does).
CANCELLABLE = (
    "accepted",
    "pre-migrating",
    "confirming",
    "reverting",
    "preparing",
    "running",
    "post-migrating",
)


async def cancel_for_delete(conn: Connection, instance_uuid: UUID) -> list[Migration]:
    """Delete wins: end the server's moves under way as ``cancelled``; the ones ended.

    Take the instance's row lock first (the documented order). The moves' claims go with
    the server's (``allocations.release_instance``); a step of a cancelled move that
    arrives late finds it ended and removes what it built.
    """
    rows = await conn.fetch(
        """UPDATE migrations SET status = 'cancelled', updated_at = now()
            WHERE instance_uuid = $1 AND status = ANY($2::text[]) AND deleted_at IS NULL
        RETURNING *""",
        instance_uuid,
        list(CANCELLABLE),
    )
    await conn.execute(
        """UPDATE migrations SET status = 'confirmed', updated_at = now()
            WHERE instance_uuid = $1 AND migration_type IN ('migration', 'resize')
              AND status = 'finished' AND deleted_at IS NULL""",
        instance_uuid,
    )
    return [Migration.from_row(row) for row in rows]


async def latest(conn: Connection, instance_uuid: UUID) -> Migration | None:
    """The instance's most recent move, whatever its status."""
    row = await conn.fetchrow(
        """SELECT * FROM migrations WHERE instance_uuid = $1 AND deleted_at IS NULL
            ORDER BY id DESC LIMIT 1""",
        instance_uuid,
    )
    return None if row is None else Migration.from_row(row)


async def in_progress(conn: Connection, instance_uuid: UUID) -> Migration | None:
    """The instance's move that has not ended yet, if any."""
    row = await conn.fetchrow(
        """SELECT * FROM migrations
            WHERE instance_uuid = $1 AND deleted_at IS NULL
              AND status IN ('accepted', 'pre-migrating', 'finished', 'confirming',
                             'reverting', 'preparing', 'running', 'post-migrating')
            ORDER BY id DESC LIMIT 1""",
        instance_uuid,
    )
    return None if row is None else Migration.from_row(row)


@dataclass(frozen=True)
class MigrationQuery:
    """The filters ``GET /os-migrations`` takes (``None``: not filtered)."""

    host: str | None = None
    status: str | None = None
    instance_uuid: UUID | None = None
    migration_type: str | None = None
    source_compute: str | None = None
    project_id: str | None = None
    user_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


async def list_page(
    conn: Connection, query: MigrationQuery, *, marker: UUID | None, limit: int | None
) -> list[Migration]:
    """Matching migrations, newest first, after the ``marker`` migration."""
    after = None
    if marker is not None:
        after = await conn.fetchrow("SELECT id FROM migrations WHERE uuid = $1", marker)
        if after is None:
            raise NotFound(f"Marker {marker} could not be found.")
    rows = await conn.fetch(
        """SELECT * FROM migrations
            WHERE deleted_at IS NULL
              AND ($1::text IS NULL OR source_compute = $1 OR dest_compute = $1)
              AND ($2::text IS NULL OR status = $2)
              AND ($3::uuid IS NULL OR instance_uuid = $3)
              AND ($4::text IS NULL OR migration_type = $4)
              AND ($5::text IS NULL OR source_compute = $5)
              AND ($6::text IS NULL OR project_id = $6)
              AND ($7::text IS NULL OR user_id = $7)
              AND ($8::timestamptz IS NULL OR coalesce(updated_at, created_at) >= $8)
              AND ($9::timestamptz IS NULL OR coalesce(updated_at, created_at) <= $9)
              AND ($10::bigint IS NULL OR id < $10)
            ORDER BY id DESC
            LIMIT $11""",
        query.host,
        query.status,
        query.instance_uuid,
        query.migration_type,
        query.source_compute,
        query.project_id,
        query.user_id,
        query.since,
        query.until,
        None if after is None else after["id"],
        limit,
    )
    return [Migration.from_row(row) for row in rows]
