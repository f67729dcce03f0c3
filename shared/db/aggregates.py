"""Queries on ``aggregates``, their hosts and their metadata.

A host's availability zone follows its aggregates: every change of an aggregate's hosts
or of its ``availability_zone`` metadata sets ``compute_nodes.availability_zone`` of the
hosts concerned (:func:`sync_zones`) from the aggregate's zone, else from the zone the
agent reports, in the same transaction; an agent's report does the same
(:func:`shared.db.compute_nodes.upsert`). Everything that reads a node's zone — the
scheduler, servers, ``os-availability-zone`` — reads that one column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import asyncpg

from shared.db.pool import Connection
from shared.exceptions import AggregateNotFound, AlreadyExists
from shared.objects.aggregate import ZONE_KEY, Aggregate

_SELECT = """
    SELECT a.*,
           coalesce((SELECT array_agg(s.host ORDER BY s.host) FROM aggregate_hosts h
                        JOIN services s ON s.id = h.service_id
                      WHERE h.aggregate_id = a.id), '{}') AS hosts,
           coalesce((SELECT array_agg(h.service_id ORDER BY h.service_id)
                       FROM aggregate_hosts h WHERE h.aggregate_id = a.id), '{}') AS service_ids,
           coalesce((SELECT jsonb_object_agg(m.key, m.value) FROM aggregate_metadata m
                      WHERE m.aggregate_id = a.id), '{}'::jsonb) AS metadata
      FROM aggregates a"""


def _aggregate(row: Any) -> Aggregate:
    return Aggregate.model_validate(dict(row))


async def create(conn: Connection, *, uuid: UUID, name: str, zone: str | None) -> Aggregate:
    try:
        aggregate_id = await conn.fetchval(
            "INSERT INTO aggregates (uuid, name) VALUES ($1, $2) RETURNING id", uuid, name
        )
    except asyncpg.UniqueViolationError:
        raise AlreadyExists(f"Aggregate {name} already exists.") from None
    if zone is not None:
        await set_metadata(conn, aggregate_id, {ZONE_KEY: zone})
    return await get(conn, aggregate_id)


async def get(conn: Connection, aggregate_id: int, *, lock: bool = False) -> Aggregate:
    row = await conn.fetchrow(
        f"{_SELECT} WHERE a.id = $1 AND a.deleted_at IS NULL{' FOR UPDATE' if lock else ''}",
        aggregate_id,
    )
    if row is None:
        raise AggregateNotFound(f"Aggregate {aggregate_id} could not be found.")
    return _aggregate(row)


async def list_aggregates(conn: Connection) -> list[Aggregate]:
    rows = await conn.fetch(f"{_SELECT} WHERE a.deleted_at IS NULL ORDER BY a.id")
    return [_aggregate(row) for row in rows]


async def rename(conn: Connection, aggregate_id: int, name: str) -> None:
    try:
        await conn.execute(
            "UPDATE aggregates SET name = $2, updated_at = now() WHERE id = $1",
            aggregate_id,
            name,
        )
    except asyncpg.UniqueViolationError:
        raise AlreadyExists(f"Aggregate {name} already exists.") from None


async def delete(conn: Connection, aggregate_id: int) -> None:
    await conn.execute(
        "UPDATE aggregates SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL",
        aggregate_id,
    )


async def set_metadata(
    conn: Connection, aggregate_id: int, metadata: Mapping[str, str | None]
) -> None:
    """Set each key to its value; a ``None`` value removes the key."""
    for key, value in metadata.items():
        if value is None:
            await conn.execute(
                "DELETE FROM aggregate_metadata WHERE aggregate_id = $1 AND key = $2",
                aggregate_id,
                key,
            )
        else:
            await conn.execute(
                """INSERT INTO aggregate_metadata (aggregate_id, key, value) VALUES ($1, $2, $3)
                   ON CONFLICT (aggregate_id, key) DO UPDATE SET value = EXCLUDED.value""",
                aggregate_id,
                key,
                value,
            )
    await conn.execute("UPDATE aggregates SET updated_at = now() WHERE id = $1", aggregate_id)


async def add_host(conn: Connection, aggregate_id: int, service_id: int) -> bool:
    """False if the host (its compute service) was in the aggregate already."""
    status = await conn.execute(
        """INSERT INTO aggregate_hosts (aggregate_id, service_id) VALUES ($1, $2)
           ON CONFLICT DO NOTHING""",
        aggregate_id,
        service_id,
    )
    return status != "INSERT 0 0"


async def remove_host(conn: Connection, aggregate_id: int, service_id: int) -> bool:
    """False if the host was not in the aggregate."""
    status = await conn.execute(
        "DELETE FROM aggregate_hosts WHERE aggregate_id = $1 AND service_id = $2",
        aggregate_id,
        service_id,
    )
    return status != "DELETE 0"


async def zones_of(conn: Connection, service_id: int, *, leaving_out: int) -> set[str]:
    """The zones the host's other live aggregates give it."""
    rows = await conn.fetch(
        """SELECT DISTINCT m.value FROM aggregate_hosts h
             JOIN aggregates a ON a.id = h.aggregate_id AND a.deleted_at IS NULL
             JOIN aggregate_metadata m ON m.aggregate_id = a.id AND m.key = $3
            WHERE h.service_id = $1 AND a.id <> $2""",
        service_id,
        leaving_out,
        ZONE_KEY,
    )
    return {row["value"] for row in rows}


async def zone_now(conn: Connection, service_id: int) -> str | None:
    """The zone the host's nodes are in now."""
    zone: str | None = await conn.fetchval(
        """SELECT min(availability_zone) FROM compute_nodes
            WHERE service_id = $1 AND deleted_at IS NULL""",
        service_id,
    )
    return zone


async def node_ids(conn: Connection, service_ids: Sequence[int]) -> list[int]:
    rows = await conn.fetch(
        """SELECT id FROM compute_nodes
            WHERE service_id = ANY($1::bigint[]) AND deleted_at IS NULL""",
        list(service_ids),
    )
    return [row["id"] for row in rows]


async def lock_all(conn: Connection) -> None:
    """Serialise aggregate changes until the transaction ends (zones are checked across
    aggregates, so two changes at once could each miss the other's)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('keel aggregates'))")


async def sync_zones(conn: Connection, service_ids: Sequence[int]) -> None:
    """Set the zone of the hosts' nodes: their aggregate's, else the one reported."""
    await conn.execute(
        """UPDATE compute_nodes
              SET availability_zone = COALESCE(keel_aggregate_zone(service_id),
                                               reported_availability_zone, availability_zone)
            WHERE service_id = ANY($1::bigint[]) AND deleted_at IS NULL""",
        list(service_ids),
    )
