"""Queries on ``request_specs``: what was asked for at create time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance, RequestSpec


def stored(spec: RequestSpec) -> dict[str, object]:
    """What is kept of a spec: not what concerns one request only (its claim's consumer,
    its requested destination), so later moves and rebuilds choose freely."""
    kept = spec.model_copy(
        update={"consumer_uuid": None, "requested_destination": None, "group": None}
    )
    data: dict[str, object] = kept.model_dump(mode="json")
    return data


async def create(
    conn: Connection, spec: RequestSpec, *, scheduler_hints: dict[str, list[str]] | None = None
) -> None:
    """Keep the spec, and the scheduler hints the create asked with (shown from compute
    microversion 2.100; kept beside the spec, which the scheduler is sent without them)."""
    await conn.execute(
        "INSERT INTO request_specs (instance_uuid, spec, scheduler_hints) VALUES ($1, $2, $3)",
        spec.instance_uuid,
        stored(spec),
        scheduler_hints or {},
    )


async def lock_pinned_zone(conn: Connection, instance_uuid: UUID) -> tuple[bool, str | None]:
    """Lock the server's spec (in a transaction) and read the zone it pins the server to:
    ``(False, None)`` for a server without a spec."""
    row = await conn.fetchrow(
        """SELECT spec->>'availability_zone' AS zone FROM request_specs
            WHERE instance_uuid = $1 FOR UPDATE""",
        instance_uuid,
    )
    return (False, None) if row is None else (True, row["zone"])


async def set_pinned_zone(conn: Connection, instance_uuid: UUID, zone: str | None) -> None:
    """Pin the server to ``zone`` for its later moves, or unpin it (``None``)."""
    await conn.execute(
        """UPDATE request_specs
              SET spec = jsonb_set(spec, '{availability_zone}',
                                   COALESCE(to_jsonb($2::text), 'null'::jsonb)),
                  updated_at = now()
            WHERE instance_uuid = $1""",
        instance_uuid,
        zone,
    )


@dataclass(frozen=True)
class Asked:
    """What a server's create asked for that the compute API shows: the zone it pinned
    (2.96) and its scheduler hints (2.100)."""

    zone: str | None
    scheduler_hints: dict[str, list[str]]


async def asked(conn: Connection, instance_uuids: Sequence[UUID]) -> dict[UUID, Asked]:
    """What each server's create asked for; servers without a spec are left out."""
    rows = await conn.fetch(
        """SELECT instance_uuid, spec->>'availability_zone' AS zone, scheduler_hints
             FROM request_specs WHERE instance_uuid = ANY($1::uuid[])""",
        list(instance_uuids),
    )
    return {
        row["instance_uuid"]: Asked(row["zone"], dict(row["scheduler_hints"] or {})) for row in rows
    }


async def get(conn: Connection, instance_uuid: UUID) -> RequestSpec:
    spec = await conn.fetchval(
        "SELECT spec FROM request_specs WHERE instance_uuid = $1", instance_uuid
    )
    if spec is None:
        raise InstanceNotFound(f"no request spec for instance {instance_uuid}")
    return RequestSpec.model_validate(spec)


async def with_instance(
    conn: Connection, instance_uuid: UUID
) -> tuple[Instance | None, RequestSpec | None]:
    """The instance (deleted or not) and its spec, in one round trip; ``None`` for each
    that does not exist."""
    row = await conn.fetchrow(
        """SELECT i.*, rs.spec AS keel_request_spec
             FROM instances i LEFT JOIN request_specs rs ON rs.instance_uuid = i.uuid
            WHERE i.uuid = $1""",
        instance_uuid,
    )
    if row is None:
        return None, None
    spec = row["keel_request_spec"]
    return Instance.from_row(row), None if spec is None else RequestSpec.model_validate(spec)


async def save(conn: Connection, spec: RequestSpec) -> None:
    await conn.execute(
        "UPDATE request_specs SET spec = $2, updated_at = now() WHERE instance_uuid = $1",
        spec.instance_uuid,
        stored(spec),
    )
