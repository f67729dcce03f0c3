"""Queries on ``orphaned_guests``: guests no record explains, kept for an operator."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from shared.db.pool import Connection


class OrphanedGuest(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    hypervisor_hostname: str
    instance_uuid: UUID
    reason: str
    first_seen: datetime
    last_seen: datetime


async def report(conn: Connection, node_id: int, found: Sequence[tuple[UUID, str]]) -> None:
    """Record what the node's agent found now; what it no longer finds is forgotten.

    One statement, one round trip: the forgetting and the recording see the same rows
    and touch different ones."""
    latest = dict(found)  # a guest named twice keeps its last reason
    await conn.execute(
        """WITH forgotten AS (
               DELETE FROM orphaned_guests
                WHERE compute_node_id = $1 AND NOT instance_uuid = ANY($2::uuid[]))
           INSERT INTO orphaned_guests (compute_node_id, instance_uuid, reason)
           SELECT $1, f.instance_uuid, f.reason
             FROM unnest($2::uuid[], $3::text[]) AS f(instance_uuid, reason)
           ON CONFLICT (compute_node_id, instance_uuid)
           DO UPDATE SET reason = EXCLUDED.reason, last_seen = now()""",
        node_id,
        list(latest),
        list(latest.values()),
    )


async def list_all(conn: Connection, host: str | None = None) -> list[OrphanedGuest]:
    rows = await conn.fetch(
        """SELECT n.host, n.hypervisor_hostname, o.instance_uuid, o.reason,
                  o.first_seen, o.last_seen
             FROM orphaned_guests o JOIN compute_nodes n ON n.id = o.compute_node_id
            WHERE ($1::text IS NULL OR n.host = $1)
            ORDER BY n.host, o.first_seen""",
        host,
    )
    return [OrphanedGuest.model_validate(dict(row)) for row in rows]
