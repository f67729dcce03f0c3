"""Queries on ``instance_actions``: the audit trail of what was done to an instance."""

from __future__ import annotations

from uuid import UUID

from shared.context import RequestContext
from shared.db.pool import Connection


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
    conn: Connection, instance_uuid: UUID, action: str, message: str | None = None
) -> None:
    """Close the newest open record of ``action`` for the instance (idempotent)."""
    await conn.execute(
        """UPDATE instance_actions SET finish_time = now(), message = $3
            WHERE id = (SELECT id FROM instance_actions
                         WHERE instance_uuid = $1 AND action = $2 AND finish_time IS NULL
                         ORDER BY start_time DESC LIMIT 1)""",
        instance_uuid,
        action,
        message,
    )
