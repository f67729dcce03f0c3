"""Queries of host tasks (:mod:`shared.objects.host_task`): start or resume, list, and the
compare-and-swaps the conductors' sweep advances them with.

Every change of a task or an item names the status it expects, so two conductors that
sweep one task at once (one of them with a stale view) change each row once: the loser
of a swap gets ``None`` or ``False`` and does nothing else.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from shared.context import RequestContext
from shared.db.pool import Connection
from shared.objects.host_task import (
    OPEN_ITEMS,
    HostTask,
    HostTaskItem,
    ItemStatus,
    TaskCounts,
    TaskStatus,
)
from shared.objects.service import Service

_TASK = """SELECT t.*, EXTRACT(EPOCH FROM t.deadline - now())::float8 AS deadline_in
             FROM host_tasks t"""


@dataclass(frozen=True)
class ServerOnHost:
    """A server a task may have to move, as the sweep sees it."""

    uuid: UUID
    name: str
    vm_state: str
    task_state: str | None
    compute_id: int | None


async def start(
    conn: Connection,
    ctx: RequestContext,
    *,
    kind: str,
    service: Service,
    parallel: int,
    cold_fallback: bool,
    deadline: float,
) -> tuple[HostTask, bool]:
    """A new running task for ``service``'s host, or the one already running there;
    with whether it is new. Two starts at once make one task (a unique index)."""
    row = await conn.fetchrow(
        """INSERT INTO host_tasks (uuid, kind, service_id, host, parallel, cold_fallback,
                                   deadline, user_id, project_id)
           VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8, $9)
           ON CONFLICT (service_id) WHERE status = 'running' DO NOTHING
        RETURNING id""",
        uuid.uuid4(),
        kind,
        service.id,
        service.host,
        parallel,
        cold_fallback,
        deadline,
        ctx.user_id,
        ctx.project_id,
    )
    if row is not None:
        return await get_by_id(conn, row["id"]), True
    running = await running_on(conn, service.id)
    if running is None:  # it ended between the two statements: start again
        return await start(
            conn,
            ctx,
            kind=kind,
            service=service,
            parallel=parallel,
            cold_fallback=cold_fallback,
            deadline=deadline,
        )
    return running, False


async def running_on(conn: Connection, service_id: int) -> HostTask | None:
    row = await conn.fetchrow(
        f"{_TASK} WHERE t.service_id = $1 AND t.status = 'running'", service_id
    )
    return None if row is None else HostTask.from_row(row)


async def get_by_id(conn: Connection, task_id: int) -> HostTask:
    row = await conn.fetchrow(f"{_TASK} WHERE t.id = $1", task_id)
    assert row is not None
    return HostTask.from_row(row)


async def find(conn: Connection, ref: str) -> HostTask | None:
    """The task ``ref`` names: its uuid, or its number; ``None`` if there is none."""
    if ref.isascii() and ref.isdigit() and len(ref) <= 18:
        row = await conn.fetchrow(f"{_TASK} WHERE t.id = $1", int(ref))
    else:
        try:
            wanted = UUID(ref)
        except ValueError:
            return None
        row = await conn.fetchrow(f"{_TASK} WHERE t.uuid = $1", wanted)
    return None if row is None else HostTask.from_row(row)


async def list_tasks(conn: Connection, *, include_ended: bool, limit: int) -> list[HostTask]:
    """Running tasks (and, with ``include_ended``, ended ones too), newest first."""
    rows = await conn.fetch(
        f"{_TASK} WHERE $1 OR t.status = 'running' ORDER BY t.id DESC LIMIT $2",
        include_ended,
        limit,
    )
    return [HostTask.from_row(row) for row in rows]


async def running_ids(conn: Connection) -> list[int]:
    rows = await conn.fetch("SELECT id FROM host_tasks WHERE status = 'running' ORDER BY id")
    return [row["id"] for row in rows]


async def take(conn: Connection, task_id: int, sweeper: UUID, lease: float) -> HostTask | None:
    """Take the task for ``lease`` seconds if it still runs and no other sweeper holds it
    (a compare-and-swap); ``None`` otherwise."""
    row = await conn.fetchrow(
        """UPDATE host_tasks SET swept_by = $2, swept_until = now() + make_interval(secs => $3)
            WHERE id = $1 AND status = 'running'
              AND (swept_until IS NULL OR swept_until < now() OR swept_by = $2)
        RETURNING id""",
        task_id,
        sweeper,
        lease,
    )
    return None if row is None else await get_by_id(conn, task_id)


async def release(conn: Connection, task_id: int, sweeper: UUID) -> None:
    """Give the task back for any sweeper to take."""
    await conn.execute(
        "UPDATE host_tasks SET swept_until = NULL WHERE id = $1 AND swept_by = $2",
        task_id,
        sweeper,
    )


async def note(conn: Connection, task_id: int, message: str | None) -> None:
    """What a running task waits for now (``None``: nothing)."""
    await conn.execute(
        """UPDATE host_tasks SET message = $2, updated_at = now()
            WHERE id = $1 AND status = 'running' AND message IS DISTINCT FROM $2""",
        task_id,
        message,
    )


async def end(conn: Connection, task_id: int, status: TaskStatus, message: str | None) -> bool:
    """running → ``status``; False if it had already ended."""
    ended = await conn.fetchval(
        """UPDATE host_tasks SET status = $2, message = $3, updated_at = now(),
                  ended_at = now()
            WHERE id = $1 AND status = 'running' RETURNING id""",
        task_id,
        status.value,
        message,
    )
    return ended is not None


# --- items ---------------------------------------------------------------------------


async def items(conn: Connection, task_id: int) -> list[HostTaskItem]:
    rows = await conn.fetch("SELECT * FROM host_task_items WHERE task_id = $1 ORDER BY id", task_id)
    return [HostTaskItem.from_row(row) for row in rows]


async def counts(conn: Connection, task_ids: Sequence[int]) -> dict[int, TaskCounts]:
    """Each task's items by status."""
    rows = await conn.fetch(
        """SELECT task_id, status, count(*) AS n FROM host_task_items
            WHERE task_id = ANY($1::bigint[]) GROUP BY task_id, status""",
        list(task_ids),
    )
    found: dict[int, dict[str, int]] = {task_id: {} for task_id in task_ids}
    for row in rows:
        found[row["task_id"]][row["status"]] = row["n"]
    return {task_id: TaskCounts(**by_status) for task_id, by_status in found.items()}


async def servers_on(conn: Connection, service_id: int) -> list[ServerOnHost]:
    """The live servers whose current copy is on the service's nodes, oldest first."""
    rows = await conn.fetch(
        """SELECT i.uuid, i.display_name, i.vm_state, i.task_state, i.compute_id
             FROM instances i JOIN compute_nodes n ON n.id = i.compute_id
            WHERE n.service_id = $1 AND i.deleted_at IS NULL
            ORDER BY i.id""",
        service_id,
    )
    return [
        ServerOnHost(
            uuid=row["uuid"],
            name=row["display_name"] or "",
            vm_state=row["vm_state"],
            task_state=row["task_state"],
            compute_id=row["compute_id"],
        )
        for row in rows
    ]


async def add_items(conn: Connection, task_id: int, servers: Sequence[ServerOnHost]) -> int:
    """An item for each server the task has none for yet; how many were added."""
    if not servers:
        return 0
    added = await conn.fetch(
        """INSERT INTO host_task_items (task_id, instance_uuid, name)
           SELECT $1, s.uuid, s.name FROM unnest($2::uuid[], $3::text[]) AS s (uuid, name)
           ON CONFLICT (task_id, instance_uuid) DO NOTHING RETURNING id""",
        task_id,
        [server.uuid for server in servers],
        [server.name for server in servers],
    )
    return len(added)


async def swap_item(
    conn: Connection,
    item_id: int,
    *,
    expected: Sequence[ItemStatus],
    new: ItemStatus,
    message: str | None = None,
    dest: str | None = None,
    migration_uuid: UUID | None = None,
) -> bool:
    """``expected`` → ``new`` with the message (and destination, and move) given; False if
    lost. A migration is kept unless another is given."""
    swapped = await conn.fetchval(
        """UPDATE host_task_items
              SET status = $3, message = $4, dest = COALESCE($5, dest), updated_at = now(),
                  migration_uuid = COALESCE($6, migration_uuid)
            WHERE id = $1 AND status = ANY($2::text[]) RETURNING id""",
        item_id,
        [status.value for status in expected],
        new.value,
        message,
        dest,
        migration_uuid,
    )
    return swapped is not None


async def claim_item(conn: Connection, task: HostTask, item_id: int, migration_uuid: UUID) -> bool:
    """pending → moving with its move, while fewer than the task's ``parallel`` items are
    moving; False otherwise. Locks the task's row until the transaction ends, so claims
    of one task are counted one at a time, whoever makes them."""
    locked = await conn.fetchval(
        "SELECT id FROM host_tasks WHERE id = $1 AND status = 'running' FOR NO KEY UPDATE",
        task.id,
    )
    if locked is None:
        return False
    moving = await conn.fetchval(
        "SELECT count(*) FROM host_task_items WHERE task_id = $1 AND status = 'moving'",
        task.id,
    )
    if moving >= task.parallel:
        return False
    return await swap_item(
        conn,
        item_id,
        expected=[ItemStatus.PENDING],
        new=ItemStatus.MOVING,
        migration_uuid=migration_uuid,
    )


async def fail_open_items(conn: Connection, task_id: int, why_pending: str) -> int:
    """At a task's end: every pending item failed with ``why_pending``, every moving one
    with what its move is doing (it goes on without the task); how many."""
    ended = await conn.fetch(
        """UPDATE host_task_items i
              SET status = 'failed', updated_at = now(),
                  message = CASE WHEN i.status = 'pending' THEN $2
                            ELSE 'still moving when the task ended: migration '
                                 || i.migration_uuid::text || ' ('
                                 || COALESCE((SELECT m.status FROM migrations m
                                               WHERE m.uuid = i.migration_uuid), '?')
                                 || ') goes on without it' END
            WHERE i.task_id = $1 AND i.status = ANY($3::text[]) RETURNING i.id""",
        task_id,
        why_pending,
        list(OPEN_ITEMS),
    )
    return len(ended)


# --- the moves the items started ------------------------------------------------------


@dataclass(frozen=True)
class MoveState:
    """Where one item's move stands."""

    migration_type: str
    status: str
    dest: str | None
    #: Seconds since its record last changed, by the database's clock.
    idle: float
    #: The message of the move's instance action, once it ended (why it failed).
    message: str | None


async def moves_of(conn: Connection, migration_uuids: Sequence[UUID]) -> dict[UUID, MoveState]:
    """The records of the moves ``migration_uuids``, with their instance action's message."""
    rows = await conn.fetch(
        """SELECT m.uuid, m.migration_type, m.status, m.dest_compute,
                  EXTRACT(EPOCH FROM now() - COALESCE(m.updated_at, m.created_at))::float8
                      AS idle,
                  (SELECT a.message FROM instance_actions a
                    WHERE a.instance_uuid = m.instance_uuid
                      AND a.action = CASE m.migration_type
                                         WHEN 'evacuation' THEN 'evacuate'
                                         WHEN 'live-migration' THEN 'live-migration'
                                         ELSE 'migrate' END
                      AND a.start_time >= m.created_at - interval '1 second'
                    ORDER BY a.start_time LIMIT 1) AS message
             FROM migrations m WHERE m.uuid = ANY($1::uuid[])""",
        list(migration_uuids),
    )
    return {
        row["uuid"]: MoveState(
            migration_type=row["migration_type"],
            status=row["status"],
            dest=row["dest_compute"],
            idle=row["idle"],
            message=row["message"],
        )
        for row in rows
    }
