"""Queries on ``request_specs``: what was asked for at create time."""

from __future__ import annotations

from uuid import UUID

from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import RequestSpec


def _stored(spec: RequestSpec) -> dict[str, object]:
    """What is kept of a spec: not what concerns one request only (its claim's consumer,
    its requested destination), so later moves and rebuilds choose freely."""
    kept = spec.model_copy(
        update={"consumer_uuid": None, "requested_destination": None, "group": None}
    )
    data: dict[str, object] = kept.model_dump(mode="json")
    return data


async def create(conn: Connection, spec: RequestSpec) -> None:
    await conn.execute(
        "INSERT INTO request_specs (instance_uuid, spec) VALUES ($1, $2)",
        spec.instance_uuid,
        _stored(spec),
    )


async def get(conn: Connection, instance_uuid: UUID) -> RequestSpec:
    spec = await conn.fetchval(
        "SELECT spec FROM request_specs WHERE instance_uuid = $1", instance_uuid
    )
    if spec is None:
        raise InstanceNotFound(f"no request spec for instance {instance_uuid}")
    return RequestSpec.model_validate(spec)


async def save(conn: Connection, spec: RequestSpec) -> None:
    await conn.execute(
        "UPDATE request_specs SET spec = $2, updated_at = now() WHERE instance_uuid = $1",
        spec.instance_uuid,
        _stored(spec),
    )
