"""Queries on ``instance_actions``: the audit trail of what was done to an instance."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from uuid import UUID

from shared.context import RequestContext
from shared.db.pool import Connection
from shared.exceptions import NotFound
from shared.objects.instance import InstanceAction
from shared.versions import TAKING_REQUESTS_VERSION


async def start(conn: Connection, ctx: RequestContext, instance_uuid: UUID, action: str) -> None:
    await conn.execute(
        """INSERT INTO instance_actions (instance_uuid, action, request_id, user_id, project_id)
           VALUES ($1, $2, $3, $4, $5)""",
        instance_uuid,
        action,
        ctx.request_id,
        ctx.user_id,
        ctx.project_id,
    )


async def finish(
    conn: Connection,
    instance_uuid: UUID,
    action: str,
    message: str | None = None,
    *,
    error: bool | None = None,
) -> None:
    """Close the newest open record of ``action`` for the instance (idempotent).

    A ``message`` says why it failed unless ``error=False`` (then it only explains).
    """
    failed = message is not None if error is None else error
    await conn.execute(
        """UPDATE instance_actions SET finish_time = now(), message = $3, result = $4
            WHERE id = (SELECT id FROM instance_actions
                         WHERE instance_uuid = $1 AND action = $2 AND finish_time IS NULL
                         ORDER BY start_time DESC LIMIT 1)""",
        instance_uuid,
        action,
        message,
        "Error" if failed else "Success",
    )


async def note(conn: Connection, instance_uuid: UUID, action: str, message: str) -> None:
    """Say what the newest open record of ``action`` waits for (it stays open)."""
    await conn.execute(
        """UPDATE instance_actions SET message = $3
            WHERE id = (SELECT id FROM instance_actions
                         WHERE instance_uuid = $1 AND action = $2 AND finish_time IS NULL
                         ORDER BY start_time DESC LIMIT 1)""",
        instance_uuid,
        action,
        message,
    )


async def recorded(conn: Connection, instance_uuid: UUID, request_id: str) -> bool:
    """Whether request ``request_id`` has a record for the instance."""
    found: bool = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM instance_actions
                           WHERE instance_uuid = $1 AND request_id = $2)""",
        instance_uuid,
        request_id,
    )
    return found


async def take(conn: Connection, instance_uuid: UUID, request_id: str) -> bool:
    """An agent takes request ``request_id`` before acting on it; False if keel-api has
    withdrawn it (the agent must then do nothing).

    Idempotent: a request taken already is taken again. A request with no record (work a
    service started on its own) is always taken. Run outside a transaction: the second
    statement must see a withdrawal that the first one waited for.
    """
    taken = await conn.fetchval(
        """UPDATE instance_actions SET taken_at = COALESCE(taken_at, now())
            WHERE instance_uuid = $1 AND request_id = $2 AND withdrawn_at IS NULL
        RETURNING id""",
        instance_uuid,
        request_id,
    )
    if taken is not None:
        return True
    withdrawn: bool = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM instance_actions
                           WHERE instance_uuid = $1 AND request_id = $2
                             AND withdrawn_at IS NOT NULL)""",
        instance_uuid,
        request_id,
    )
    return not withdrawn


async def take_current(
    conn: Connection,
    instance_uuid: UUID,
    request_id: str,
    task: str | Sequence[str],
    node_uuid: UUID,
) -> bool:
    """As :func:`take`, but only while the task the request began is still under way:
    the request has neither ended nor been withdrawn, and the instance is in ``task``
    (or one of several: the steps of one task) on node ``node_uuid``. False otherwise: a
    delivery of a request that already ended (or one to a host the instance has left)
    must change nothing."""
    tasks = [task] if isinstance(task, str) else list(task)
    taken = await conn.fetchval(
        """UPDATE instance_actions a SET taken_at = COALESCE(a.taken_at, now())
             FROM instances i JOIN compute_nodes n ON n.id = i.compute_id
            WHERE a.instance_uuid = $1 AND a.request_id = $2
              AND a.withdrawn_at IS NULL AND a.finish_time IS NULL
              AND i.uuid = $1 AND i.deleted_at IS NULL AND i.task_state = ANY($3::text[])
              AND n.uuid = $4
        RETURNING a.id""",
        instance_uuid,
        request_id,
        tasks,
        node_uuid,
    )
    return taken is not None


async def lock_untaken(conn: Connection, instance_uuid: UUID, request_id: str) -> bool:
    """Lock request ``request_id``'s record for a withdrawal; False once an agent took it.

    Call inside the withdrawing transaction, after locking the instance's row (the
    documented order), then :func:`withdraw` if the rest of the withdrawal holds.
    """
    taken = await conn.fetch(
        """SELECT taken_at FROM instance_actions
            WHERE instance_uuid = $1 AND request_id = $2
              FOR UPDATE""",
        instance_uuid,
        request_id,
    )
    return all(row["taken_at"] is None for row in taken)


async def withdraw_untaken(
    conn: Connection,
    instance_uuid: UUID,
    request_id: str,
    message: str,
    undo: Callable[[], Awaitable[bool]],
) -> bool:
    """keel-api withdraws its request ``request_id``: False once an agent took it, if the
    agent it was sent to is of a release that acts without taking requests, or if
    ``undo`` (the task's compare-and-swap back) finds the task already moved on; else the
    request is marked withdrawn, saying why. Call inside a transaction: it locks the
    instance's row, then the request's (the documented lock order)."""
    await conn.execute("SELECT 1 FROM instances WHERE uuid = $1 FOR UPDATE", instance_uuid)
    if not await _agent_takes_requests(conn, instance_uuid):
        return False
    if not await lock_untaken(conn, instance_uuid, request_id):
        return False
    if not await undo():
        return False
    await withdraw(conn, instance_uuid, request_id, message)
    return True


async def _agent_takes_requests(conn: Connection, instance_uuid: UUID) -> bool:
    """Whether the agent of the instance's host takes requests before acting (release
    17, ``painter``, or later): an older one acts on whatever reaches it, so a request
    sent to it can never be withdrawn (the message may have gone)."""
    version = await conn.fetchval(
        """SELECT s.version FROM instances i
             JOIN compute_nodes n ON n.id = i.compute_id
             JOIN services s ON s.id = n.service_id
            WHERE i.uuid = $1""",
        instance_uuid,
    )
    return version is None or version >= TAKING_REQUESTS_VERSION


#: A record of instance action ``a`` that no agent took, keel-api did not withdraw and
#: nothing ended: a request still under way.
UNDER_WAY_SQL = "a.taken_at IS NULL AND a.withdrawn_at IS NULL AND a.finish_time IS NULL"


async def another_under_way(
    conn: Connection, instance_uuid: UUID, action: str, request_id: str
) -> bool:
    """Whether a request of ``action`` other than ``request_id`` is recorded for the
    instance and neither withdrawn nor ended (taken or not)."""
    found: bool = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM instance_actions
                           WHERE instance_uuid = $1 AND action = $2
                             AND request_id IS DISTINCT FROM $3
                             AND withdrawn_at IS NULL AND finish_time IS NULL)""",
        instance_uuid,
        action,
        request_id,
    )
    return found


async def lock_others_open(conn: Connection, instance_uuid: UUID, request_id: str) -> bool:
    """Whether a request other than ``request_id``, of any action, is recorded for the
    instance and neither withdrawn nor ended; the records are locked, so one being
    ended or withdrawn meanwhile is waited for and then counted as ended. Call inside a
    transaction holding the instance's row (the documented lock order)."""
    rows = await conn.fetch(
        """SELECT id FROM instance_actions
            WHERE instance_uuid = $1 AND request_id IS DISTINCT FROM $2
              AND withdrawn_at IS NULL AND finish_time IS NULL
              FOR UPDATE""",
        instance_uuid,
        request_id,
    )
    return bool(rows)


async def latest_failed(conn: Connection, instance_uuid: UUID, action: str) -> bool:
    """Whether the instance's latest action (resets aside) is ``action``, ended in error."""
    row = await conn.fetchrow(
        """SELECT action, result FROM instance_actions
            WHERE instance_uuid = $1 AND action <> 'resetState'
            ORDER BY id DESC LIMIT 1""",
        instance_uuid,
    )
    return row is not None and row["action"] == action and row["result"] == "Error"


async def withdraw(conn: Connection, instance_uuid: UUID, request_id: str, message: str) -> None:
    """Mark request ``request_id`` withdrawn and ended in error, saying why."""
    await conn.execute(
        """UPDATE instance_actions
              SET withdrawn_at = now(), finish_time = COALESCE(finish_time, now()),
                  message = $3, result = 'Error'
            WHERE instance_uuid = $1 AND request_id = $2""",
        instance_uuid,
        request_id,
        message,
    )


async def list_for(
    conn: Connection,
    instance_uuid: UUID,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    marker: str | None = None,
    limit: int | None = None,
) -> list[InstanceAction]:
    """The instance's actions, newest first; ``marker`` is a request id (exclusive)."""
    after = None
    if marker is not None:
        after = await conn.fetchrow(
            """SELECT start_time, id FROM instance_actions
                WHERE instance_uuid = $1 AND request_id = $2""",
            instance_uuid,
            marker,
        )
        if after is None:
            raise NotFound(f"Marker {marker} could not be found.")
    rows = await conn.fetch(
        """SELECT * FROM instance_actions
            WHERE instance_uuid = $1
              AND ($2::timestamptz IS NULL OR coalesce(finish_time, start_time) >= $2)
              AND ($3::timestamptz IS NULL OR (start_time, id) < ($3, $4::bigint))
              AND ($6::timestamptz IS NULL OR coalesce(finish_time, start_time) <= $6)
            ORDER BY start_time DESC, id DESC
            LIMIT $5""",
        instance_uuid,
        since,
        None if after is None else after["start_time"],
        None if after is None else after["id"],
        limit,
        until,
    )
    return [InstanceAction.from_row(row) for row in rows]


async def get(conn: Connection, instance_uuid: UUID, request_id: str) -> InstanceAction:
    row = await conn.fetchrow(
        """SELECT * FROM instance_actions WHERE instance_uuid = $1 AND request_id = $2
            ORDER BY start_time DESC LIMIT 1""",
        instance_uuid,
        request_id,
    )
    if row is None:
        raise NotFound(f"Action {request_id} on instance {instance_uuid} could not be found.")
    return InstanceAction.from_row(row)
