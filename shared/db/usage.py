"""The instances a usage report covers: those running at some time within a period."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance


async def active_between(
    conn: Connection,
    start: datetime,
    end: datetime,
    *,
    project_id: str | None = None,
    marker: UUID | None = None,
    limit: int | None = None,
) -> list[Instance]:
    """Instances launched before ``end`` and not terminated before ``start``, deleted or not.

    Oldest first, following the instance ``marker``; never-launched instances are not
    included (they used nothing).
    """
    after = None
    if marker is not None:
        after = await conn.fetchrow("SELECT created_at, id FROM instances WHERE uuid = $1", marker)
        if after is None:
            raise InstanceNotFound(f"marker [{marker}] not found")
    rows = await conn.fetch(
        """SELECT * FROM instances
            WHERE launched_at < $2
              AND (terminated_at IS NULL OR terminated_at > $1)
              AND ($3::text IS NULL OR project_id = $3)
              AND ($4::timestamptz IS NULL OR (created_at, id) > ($4, $5::bigint))
            ORDER BY created_at, id
            LIMIT $6""",
        start,
        end,
        project_id,
        None if after is None else after["created_at"],
        None if after is None else after["id"],
        limit,
    )
    return [Instance.from_row(row) for row in rows]
