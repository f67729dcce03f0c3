"""os-aggregates (admin): host aggregates, their hosts and metadata.

An aggregate is a named set of compute hosts with metadata. Its ``availability_zone``
(given on create or update, or set as metadata) puts its hosts in that zone, as in Nova:
servers, ``os-availability-zone`` and the scheduler then see the hosts there; a host
leaving it goes back to the zone its agent reports. A host may not be in two zones (400),
and a zone does not change under servers: adding a host that has servers to an
aggregate with another zone, or changing the zone of an aggregate whose hosts have
servers, is a 400. The scheduler also matches its metadata against flavors
(``aggregate_instance_extra_specs:KEY``) and projects (``filter_tenant_id``): see
:mod:`services.scheduler.filters.aggregate_extra_specs` and
:mod:`services.scheduler.filters.aggregate_tenancy`.

Aggregates are named by integer id; from 2.41 they also show a ``uuid``. Every change
takes one lock, so concurrent changes never put a host in two zones.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import AdminContext
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import BadRequest, ConflictingRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.views.timestamps import naive_isotime
from shared.db import aggregates, placement, services
from shared.db.pool import Connection
from shared.exceptions import AggregateNotFound, AlreadyExists
from shared.objects.aggregate import ZONE_KEY, Aggregate
from shared.objects.service import Binary, Service

router = APIRouter(prefix="/v2.1/os-aggregates")


def aggregate_view(found: Aggregate, version: APIVersion, *, full: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": found.id,
        "name": found.name,
        "availability_zone": found.availability_zone,
        "created_at": naive_isotime(found.created_at),
        "updated_at": naive_isotime(found.updated_at),
        "deleted_at": None,
        "deleted": False,
    }
    if full:
        body["hosts"] = list(found.hosts)
        body["metadata"] = dict(found.metadata)
    if version.at_least("2.41"):
        body["uuid"] = str(found.uuid)
    return body


def _text(value: Any, field: str, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 255 or value != value.strip():
        raise BadRequest(
            f"Invalid input for field/attribute {field}. Value: {value!r}. It must be a "
            "string of 1 to 255 characters without leading or trailing whitespace."
        )
    return value


def _body(payload: Any, key: str, allowed: set[str]) -> dict[str, Any]:
    body = payload.get(key) if isinstance(payload, dict) else None
    if not isinstance(body, dict) or (isinstance(payload, dict) and len(payload) != 1):
        raise BadRequest(f"Invalid input: the body must be {{{key!r}: {{...}}}}.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(
            f"Invalid input for field/attribute {key}. Additional properties are not "
            f"allowed ({unknown[0]!r} was unexpected)."
        )
    return body


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise BadRequest("Malformed request body: it must be a JSON object.") from None


async def _changing(
    pool: DbPool,
    aggregate_id: str,
    change: Callable[[Connection, Aggregate], Awaitable[None]],
    *,
    reread: bool = True,
) -> Aggregate:
    """Run ``change`` on the aggregate under the aggregates' lock; its state afterwards
    (as it was before, without ``reread``)."""
    try:
        number = int(aggregate_id)
    except ValueError:
        raise ItemNotFound(f"Aggregate {aggregate_id} could not be found.") from None
    try:
        async with pool.acquire() as conn, conn.transaction():
            await aggregates.lock_all(conn)
            found = await aggregates.get(conn, number, lock=True)
            await change(conn, found)
            return await aggregates.get(conn, number) if reread else found
    except AggregateNotFound as exc:
        raise ItemNotFound(exc.message) from None
    except AlreadyExists as exc:
        raise ConflictingRequest(exc.message) from None


async def _service(conn: Connection, host: str, down_time: float) -> Service:
    """The compute service of ``host``; 404 if there is none."""
    known = await services.list_services(conn, down_time, host=host, binary=Binary.COMPUTE.value)
    if not known:
        raise ItemNotFound(f"Compute host {host} could not be found.")
    return known[0]


async def _check_zone(
    conn: Connection, found: Aggregate, host: str, service_id: int, zone: str | None
) -> None:
    """400 unless ``host`` may take ``zone`` from ``found``: no other aggregate gives it
    another zone, and it holds no server that would change zones."""
    if zone is None:
        return
    others = await aggregates.zones_of(conn, service_id, leaving_out=found.id) - {zone}
    if others:
        raise BadRequest(
            f"Cannot add host {host} to aggregate {found.id}: host {host} is in availability "
            f"zone {sorted(others)[0]} by another aggregate, and a host has one zone."
        )
    current = await aggregates.zone_now(conn, service_id)
    if current != zone and await _servers_on(conn, [service_id]):
        raise BadRequest(
            f"Cannot put host {host} in availability zone {zone}: it has servers in "
            f"availability zone {current}."
        )


async def _servers_on(conn: Connection, service_ids: list[int]) -> int:
    return await placement.count_on(conn, await aggregates.node_ids(conn, service_ids))


async def _set_zone(conn: Connection, found: Aggregate, zone: str | None) -> None:
    if zone == found.availability_zone:
        return
    for host, service_id in zip(found.hosts, found.service_ids, strict=True):
        await _check_zone(conn, found, host, service_id, zone)
    if found.service_ids and await _servers_on(conn, found.service_ids):
        raise BadRequest(
            f"Cannot update the availability zone of aggregate {found.id}: its hosts have "
            "servers in the current zone."
        )
    await aggregates.set_metadata(conn, found.id, {ZONE_KEY: zone})
    await aggregates.sync_zones(conn, found.service_ids)


@router.get("", dependencies=[NO_QUERY_FROM_2_102])
async def list_aggregates(pool: DbPool, ctx: AdminContext, version: Version) -> dict[str, Any]:
    async with pool.acquire() as conn:
        found = await aggregates.list_aggregates(conn)
    return {"aggregates": [aggregate_view(a, version) for a in found]}


@router.post("")
async def create_aggregate(
    request: Request, pool: DbPool, ctx: AdminContext, version: Version
) -> dict[str, Any]:
    body = _body(await _json(request), "aggregate", {"name", "availability_zone"})
    name = _text(body.get("name"), "name")
    zone = _text(body.get("availability_zone"), "availability_zone", nullable=True)
    assert name is not None
    try:
        async with pool.acquire() as conn, conn.transaction():
            await aggregates.lock_all(conn)
            made = await aggregates.create(conn, uuid=uuid.uuid4(), name=name, zone=zone)
    except AlreadyExists as exc:
        raise ConflictingRequest(exc.message) from None
    return {"aggregate": aggregate_view(made, version, full=False)}


@router.get("/{aggregate_id}", dependencies=[NO_QUERY_FROM_2_102])
async def show_aggregate(
    aggregate_id: str, pool: DbPool, ctx: AdminContext, version: Version
) -> dict[str, Any]:
    async def nothing(conn: Connection, found: Aggregate) -> None:
        return None

    return {"aggregate": aggregate_view(await _changing(pool, aggregate_id, nothing), version)}


@router.put("/{aggregate_id}")
async def update_aggregate(
    aggregate_id: str, request: Request, pool: DbPool, ctx: AdminContext, version: Version
) -> dict[str, Any]:
    body = _body(await _json(request), "aggregate", {"name", "availability_zone"})
    if not body:
        raise BadRequest("Invalid input: give a name or an availability_zone.")

    async def update(conn: Connection, found: Aggregate) -> None:
        if "name" in body:
            await aggregates.rename(conn, found.id, _text(body["name"], "name") or found.name)
        if "availability_zone" in body:
            zone = _text(body["availability_zone"], "availability_zone", nullable=True)
            await _set_zone(conn, found, zone)

    return {"aggregate": aggregate_view(await _changing(pool, aggregate_id, update), version)}


@router.delete("/{aggregate_id}", response_class=Response)
async def delete_aggregate(aggregate_id: str, pool: DbPool, ctx: AdminContext) -> Response:
    async def delete(conn: Connection, found: Aggregate) -> None:
        if found.hosts:
            raise BadRequest(
                f"Cannot delete aggregate {found.id}: it still has hosts "
                f"({', '.join(found.hosts)}); remove them first."
            )
        await aggregates.delete(conn, found.id)

    await _changing(pool, aggregate_id, delete, reread=False)
    return Response(status_code=200)


def _host_of(value: Any, action: str) -> str:
    if not isinstance(value, dict) or set(value) != {"host"}:
        raise BadRequest(f"Invalid input for field/attribute {action}: it needs exactly 'host'.")
    host = _text(value["host"], "host")
    assert host is not None
    return host


def _metadata_of(value: Any) -> dict[str, str | None]:
    if not isinstance(value, dict) or set(value) != {"metadata"}:
        raise BadRequest("Invalid input for field/attribute set_metadata: it needs 'metadata'.")
    metadata = value["metadata"]
    if not isinstance(metadata, dict):
        raise BadRequest("Invalid input for field/attribute metadata: it must be an object.")
    for key, item in metadata.items():
        _text(key, "metadata key")
        _text(item, f"metadata/{key}", nullable=True)
    return dict(metadata)


@router.post("/{aggregate_id}/action")
async def aggregate_action(
    aggregate_id: str,
    request: Request,
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
) -> dict[str, Any]:
    payload = await _json(request)
    if not isinstance(payload, dict) or len(payload) != 1:
        raise BadRequest("Invalid input: one action, add_host, remove_host or set_metadata.")
    [(action, value)] = payload.items()
    down_time = settings.service_down_time
    if action == "add_host":
        host = _host_of(value, action)

        async def change(conn: Connection, found: Aggregate) -> None:
            await _add_host(conn, found, host, down_time)

    elif action == "remove_host":
        host = _host_of(value, action)

        async def change(conn: Connection, found: Aggregate) -> None:
            service = await _service(conn, host, down_time)
            if not await aggregates.remove_host(conn, found.id, service.id):
                raise ItemNotFound(f"Cannot remove host {host} in aggregate {found.id}: not found")
            await _check_leaving(conn, found, host, service.id)
            await aggregates.sync_zones(conn, [service.id])

    elif action == "set_metadata":
        metadata = _metadata_of(value)

        async def change(conn: Connection, found: Aggregate) -> None:
            if ZONE_KEY in metadata:
                await _set_zone(conn, found, metadata[ZONE_KEY])
            others = {k: v for k, v in metadata.items() if k != ZONE_KEY}
            await aggregates.set_metadata(conn, found.id, others)

    else:
        raise BadRequest(f"Invalid input: unknown aggregate action {action!r}.")
    return {"aggregate": aggregate_view(await _changing(pool, aggregate_id, change), version)}


async def _add_host(conn: Connection, found: Aggregate, host: str, down_time: float) -> None:
    service = await _service(conn, host, down_time)
    await _check_zone(conn, found, host, service.id, found.availability_zone)
    if not await aggregates.add_host(conn, found.id, service.id):
        raise ConflictingRequest(f"Aggregate {found.id} already has host {host}.")
    await aggregates.sync_zones(conn, [service.id])


async def _check_leaving(conn: Connection, found: Aggregate, host: str, service_id: int) -> None:
    """A host with servers may not leave the zone it gives them."""
    if found.availability_zone is None or not await _servers_on(conn, [service_id]):
        return
    if await aggregates.zones_of(conn, service_id, leaving_out=found.id) == {
        found.availability_zone
    }:
        return
    raise BadRequest(
        f"Cannot remove host {host} from aggregate {found.id}: it has servers in "
        f"availability zone {found.availability_zone}."
    )
