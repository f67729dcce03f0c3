"""``GET /os-migrations`` (``openstack server migration list``) and a server's migrations.

Admins list every move, evacuations included, told apart by ``migration_type`` from
2.23. Filters, as Nova takes them: ``host`` (source or destination), ``status``,
``instance_uuid``, ``migration_type``, ``source_compute``; from 2.59 ``changes-since``
and paging by ``limit``/``marker`` (a migration's uuid), with ``uuid`` shown; from 2.66
``changes-before``; from 2.80 ``user_id`` and ``project_id``, shown as well. Other
query parameters are ignored below 2.59 and a 400 from 2.59, as in Nova.

A server's *live* migrations in progress (``accepted``, ``preparing``, ``running``,
``post-migrating``), as in Nova: ``GET /servers/{id}/migrations`` and
``/servers/{id}/migrations/{mid}`` (2.23; with the copy's memory and disk progress),
``POST /servers/{id}/migrations/{mid}/action`` ``{"force_complete": null}`` (2.22: a
``running`` one finishes its copy at once; 400 in any other status) and
``DELETE /servers/{id}/migrations/{mid}`` (2.24: abort a ``running`` one, from 2.65 an
``accepted`` or ``preparing`` one too; 400 otherwise, e.g. once ``post-migrating``). An
abort ends the record ``cancelled`` in one transaction (its claim released, the task
ended): the source learns it at its next progress report and resumes its guest.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Body, Request, Response

from services.api.http.auth import AdminContext
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.http.paging import page_request
from services.api.http.query import refuse_unknown, timestamp
from services.api.servers import locks
from services.api.views.timestamps import naive_isotime
from shared.db import instances, live_moves, moves
from shared.db.moves import MigrationQuery
from shared.exceptions import NotFound
from shared.objects.instance import Instance
from shared.objects.migration import Migration, MigrationStatus

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1")


def migration_view(migration: Migration, version: APIVersion) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": migration.id,
        "source_node": migration.source_node,
        "dest_node": migration.dest_node,
        "source_compute": migration.source_compute,
        "dest_compute": migration.dest_compute,
        "dest_host": migration.dest_host,
        "status": migration.status,
        "instance_uuid": str(migration.instance_uuid),
        "old_instance_type_id": None,
        "new_instance_type_id": None,
        "created_at": naive_isotime(migration.created_at),
        "updated_at": naive_isotime(migration.updated_at),
    }
    if version.at_least("2.23"):
        body["migration_type"] = migration.migration_type
    if version.at_least("2.59"):
        body["uuid"] = str(migration.uuid)
    if version.at_least("2.80"):
        body["user_id"] = migration.user_id
        body["project_id"] = migration.project_id
    return body


def _uuid(name: str, value: str | None) -> UUID | None:
    if value is None:
        return None
    try:
        return UUID(value)
    except ValueError:
        raise BadRequest(f"Invalid input for query parameters {name}: not a UUID.") from None


def known_names(version: APIVersion) -> set[str]:
    """The query parameters of the list at ``version``; from 2.59 others are a 400."""
    names = {"hidden", "host", "instance_uuid", "source_compute", "status", "migration_type"}
    names |= {"limit", "marker", "changes-since"}
    if version.at_least("2.66"):
        names.add("changes-before")
    if version.at_least("2.80"):
        names |= {"user_id", "project_id"}
    return names


def _query(request: Request, version: APIVersion) -> MigrationQuery:
    params = request.query_params
    refuse_unknown(params, known_names(version), version, since="2.59")
    since = params.get("changes-since") if version.at_least("2.59") else None
    until = params.get("changes-before") if version.at_least("2.66") else None
    query = MigrationQuery(
        host=params.get("host") or None,
        status=params.get("status") or None,
        instance_uuid=_uuid("instance_uuid", params.get("instance_uuid")),
        migration_type=params.get("migration_type") or None,
        source_compute=params.get("source_compute") or None,
        project_id=params.get("project_id") if version.at_least("2.80") else None,
        user_id=params.get("user_id") if version.at_least("2.80") else None,
        since=timestamp("changes-since", since) if since else None,
        until=timestamp("changes-before", until) if until else None,
    )
    if query.since and query.until and query.since > query.until:
        raise BadRequest("The value of changes-since must be less than or equal to changes-before.")
    return query


def _next(request: Request, links: Links, marker: str) -> list[dict[str, str]]:
    params = [(k, v) for k, v in request.query_params.multi_items() if k != "marker"]
    return [
        {"rel": "next", "href": f"{links.compute('os-migrations')}?"
         + urlencode([*params, ("marker", marker)])}
    ]  # fmt: skip


@router.get("/os-migrations")
async def list_migrations(
    request: Request, *, pool: DbPool, ctx: AdminContext, version: Version, links: RequestLinks
) -> dict[str, Any]:
    query = _query(request, version)
    paged = version.at_least("2.59")
    paging = page_request(
        request.query_params.get("limit") if paged else None,
        request.query_params.get("marker") if paged else None,
    )
    marker = _uuid("marker", paging.marker)
    async with pool.acquire() as conn:
        try:
            found = await moves.list_page(conn, query, marker=marker, limit=paging.limit)
        except NotFound:
            raise BadRequest(f"Marker {paging.marker} could not be found.") from None
    body: dict[str, Any] = {"migrations": [migration_view(m, version) for m in found]}
    if paged and paging.limited and len(found) == paging.limit and found:
        body["migrations_links"] = _next(request, links, str(found[-1].uuid))
    return body


def live_migration_view(migration: Migration, version: APIVersion) -> dict[str, Any]:
    """A live migration in progress, as ``/servers/{id}/migrations`` shows it."""
    body: dict[str, Any] = {
        "id": migration.id,
        "server_uuid": str(migration.instance_uuid),
        "source_node": migration.source_node,
        "dest_node": migration.dest_node,
        "source_compute": migration.source_compute,
        "dest_compute": migration.dest_compute,
        "dest_host": migration.dest_host,
        "status": migration.status,
        "memory_total_bytes": migration.memory_total_bytes,
        "memory_processed_bytes": migration.memory_processed_bytes,
        "memory_remaining_bytes": migration.memory_remaining_bytes,
        "disk_total_bytes": migration.disk_total_bytes,
        "disk_processed_bytes": migration.disk_processed_bytes,
        "disk_remaining_bytes": migration.disk_remaining_bytes,
        "created_at": naive_isotime(migration.created_at),
        "updated_at": naive_isotime(migration.updated_at),
    }
    if version.at_least("2.59"):
        body["uuid"] = str(migration.uuid)
    if version.at_least("2.80"):
        body["user_id"] = migration.user_id
        body["project_id"] = migration.project_id
    return body


async def _server(pool: asyncpg.Pool, server_id: str) -> Instance:
    try:
        instance_uuid = UUID(server_id)
        async with pool.acquire() as conn:
            return await instances.get(conn, instance_uuid)
    except (ValueError, NotFound):
        raise ItemNotFound(f"Instance {server_id} could not be found.") from None


def _migration_id(value: str) -> int:
    if not value.isdigit() or len(value) > 18:
        raise BadRequest(f"Invalid input for field/attribute migration_id: {value[:60]!r}.")
    return int(value)


async def _live_migration(pool: asyncpg.Pool, instance: Instance, migration_id: str) -> Migration:
    number = _migration_id(migration_id)
    async with pool.acquire() as conn:
        found = await live_moves.find(conn, instance.uuid, number)
    if found is None:
        raise ItemNotFound(
            f"Migration {number} for instance {instance.uuid} could not be found, or is not "
            "a live-migration."
        )
    return found


@router.get("/servers/{server_id}/migrations", dependencies=[NO_QUERY_FROM_2_102])
async def server_migrations(
    server_id: str, *, pool: DbPool, ctx: AdminContext, version: Version
) -> dict[str, Any]:
    if not version.at_least("2.23"):
        raise ItemNotFound("The resource could not be found.")
    instance = await _server(pool, server_id)
    async with pool.acquire() as conn:
        found = await live_moves.in_progress(conn, instance.uuid)
    return {"migrations": [live_migration_view(m, version) for m in found]}


@router.get("/servers/{server_id}/migrations/{migration_id}")
async def server_migration(
    server_id: str, migration_id: str, *, pool: DbPool, ctx: AdminContext, version: Version
) -> dict[str, Any]:
    if not version.at_least("2.23"):
        raise ItemNotFound("The resource could not be found.")
    instance = await _server(pool, server_id)
    migration = await _live_migration(pool, instance, migration_id)
    if migration.status not in live_moves.IN_PROGRESS:
        raise ItemNotFound(
            f"Migration {migration.id} for instance {instance.uuid} is not in progress."
        )
    return {"migration": live_migration_view(migration, version)}


@router.post(
    "/servers/{server_id}/migrations/{migration_id}/action",
    status_code=202,
    response_class=Response,
)
async def server_migration_action(
    server_id: str,
    migration_id: str,
    body: Annotated[dict[str, Any], Body()],
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
) -> Response:
    if not version.at_least("2.22"):
        raise ItemNotFound("The resource could not be found.")
    if set(body) != {"force_complete"}:
        raise BadRequest(
            'Invalid input for field/attribute: the body must be {"force_complete": null}.'
        )
    instance = await _server(pool, server_id)
    locks.check_unlocked(ctx, instance)
    migration = await _live_migration(pool, instance, migration_id)
    async with pool.acquire() as conn:
        marked = await live_moves.ask_force_complete(conn, migration.uuid)
    if marked is None:
        raise BadRequest(
            f"Migration {migration.id} state of instance {instance.uuid} is "
            f"{migration.status}. Cannot force_complete while the migration is in this state."
        )
    LOG.info(
        "force-complete of live migration %s of server %s asked",
        migration.uuid,
        instance.uuid,
        extra={"instance_uuid": str(instance.uuid), "decision": "live_migration_force_complete"},
    )
    return Response(status_code=202)


@router.delete(
    "/servers/{server_id}/migrations/{migration_id}", status_code=202, response_class=Response
)
async def abort_server_migration(
    server_id: str, migration_id: str, *, pool: DbPool, ctx: AdminContext, version: Version
) -> Response:
    if not version.at_least("2.24"):
        raise ItemNotFound("The resource could not be found.")
    instance = await _server(pool, server_id)
    locks.check_unlocked(ctx, instance)
    migration = await _live_migration(pool, instance, migration_id)
    abortable: tuple[str, ...] = (MigrationStatus.RUNNING,)
    if version.at_least("2.65"):
        abortable = (MigrationStatus.ACCEPTED, MigrationStatus.PREPARING, MigrationStatus.RUNNING)
    async with pool.acquire() as conn, conn.transaction():
        ended = await live_moves.end_in(
            conn,
            migration.uuid,
            abortable,
            MigrationStatus.CANCELLED,
            "the live migration was aborted",
        )
    if ended is None:
        raise BadRequest(
            f"Migration {migration.id} state of instance {instance.uuid} is "
            f"{migration.status}. Cannot abort live migration while the migration is in "
            "this state."
        )
    LOG.info(
        "live migration %s of server %s aborted: the server stays on %s",
        migration.uuid,
        instance.uuid,
        migration.source_compute,
        extra={"instance_uuid": str(instance.uuid), "decision": "live_migration_cancelled"},
    )
    return Response(status_code=202)
