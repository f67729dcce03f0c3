"""Servers: create, list (summary and detail), show, delete.

Members see their own project's servers. Admins see their own project's unless they
ask for ``all_tenants`` (optionally narrowed by ``project_id``/``tenant_id``), and may
filter by ``host``. ``name`` is a regular expression, ``status`` one or more API
statuses; other filters clients send (``deleted=False``…) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Request, Response

from services.api.auth import Context
from services.api.deps import AppSettings, Compute, Conductor, DbPool, RequestLinks, Version
from services.api.faults import BadRequest, Forbidden, ItemNotFound
from services.api.links import Links
from services.api.microversion import APIVersion
from services.api.paging import PageRequest, marker_not_found, next_marker, page_request
from services.api.server_create import NewServerBody, create_server
from services.api.server_delete import delete_server
from services.api.views.servers import STATUS_FILTERS, ServerView, created_body
from shared.context import RequestContext
from shared.db import instances
from shared.db import services as services_db
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance
from shared.objects.service import Binary, Service

router = APIRouter(prefix="/v2.1/servers")


def _query(name: str, description: str, *, many: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if many:
        schema = {"type": "array", "items": schema}
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


#: The list filters, read from the query string by :class:`ServerQuery`, for the
#: OpenAPI document.
LIST_PARAMETERS = {
    "parameters": [
        _query("name", "a regular expression the server name must match"),
        _query("status", "API status(es) to list, e.g. ACTIVE", many=True),
        _query("host", "admins: servers on this compute host"),
        _query("all_tenants", "admins: a boolean, list every project's servers"),
        _query("project_id", "admins with all_tenants: one project's servers"),
        _query("tenant_id", "the same as project_id"),
        _query("limit", "at most this many servers"),
        _query("marker", "the id of the server before the page"),
    ]
}

_TRUE = {"", "1", "t", "true", "on", "y", "yes"}
_FALSE = {"0", "f", "false", "off", "n", "no"}


def all_tenants(value: str | None) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise BadRequest(f"Invalid all_tenants value {value!r}: expected a boolean.")


def vm_states_for(statuses: list[str], version: APIVersion) -> list[str] | None:
    """The vm states the ``status`` filters select; ``None`` when there is no filter."""
    if not statuses:
        return None
    selected: list[str] = []
    for status in statuses:
        states = STATUS_FILTERS.get(status.upper())
        if states is None:
            if version.at_least("2.38"):
                raise BadRequest(f"Invalid status value {status!r}")
            continue
        selected.extend(states)
    return selected


def host_status(service: Service) -> str:
    if service.forced_down:
        return "DOWN"
    if service.disabled:
        return "MAINTENANCE"
    return "UP" if service.is_up else "UNKNOWN"


async def server_view(
    conn: Connection, ctx: RequestContext, version: APIVersion, links: Links, down_time: float
) -> ServerView:
    """The view for this caller; admins from 2.16 also get each host's status."""
    statuses: dict[str, str] = {}
    if ctx.is_admin and version.at_least("2.16"):
        computes = await services_db.list_services(conn, down_time, binary=Binary.COMPUTE)
        statuses = {service.host: host_status(service) for service in computes}
    return ServerView(version=version, links=links, is_admin=ctx.is_admin, host_statuses=statuses)


@dataclass(frozen=True)
class ServerQuery:
    """A list request's filters, as far as the caller is allowed them."""

    project_id: str | None
    host: str | None
    name: str | None
    vm_states: list[str] | None
    paging: PageRequest
    marker: UUID | None

    @classmethod
    def from_request(
        cls, request: Request, ctx: RequestContext, version: APIVersion
    ) -> ServerQuery:
        params = request.query_params
        project, host = ctx.project_id, params.get("host") if ctx.is_admin else None
        if all_tenants(params.get("all_tenants")):
            if not ctx.is_admin:
                raise Forbidden(
                    "Policy doesn't allow listing servers of all projects: it needs the admin role."
                )
            project = params.get("project_id") or params.get("tenant_id")
        paging = page_request(params.get("limit"), params.get("marker"))
        return cls(
            project_id=project,
            host=host,
            name=params.get("name") or None,
            vm_states=vm_states_for(params.getlist("status"), version),
            paging=paging,
            marker=_marker(paging.marker),
        )


def _marker(marker: str | None) -> UUID | None:
    if marker is None:
        return None
    try:
        return UUID(marker)
    except ValueError:
        raise marker_not_found(marker) from None


async def _find_page(conn: Connection, query: ServerQuery) -> list[Instance]:
    if query.vm_states == []:
        return []
    try:
        return await instances.list_page(
            conn,
            project_id=query.project_id,
            name=query.name,
            host=query.host,
            vm_states=query.vm_states,
            marker=query.marker,
            limit=query.paging.limit,
        )
    except InstanceNotFound:
        raise marker_not_found(str(query.marker)) from None
    except asyncpg.InvalidRegularExpressionError as exc:
        raise BadRequest(f"Invalid name filter {query.name!r}: {exc}") from None


def _next_link(request: Request, links: Links, path: str, marker: str) -> list[dict[str, str]]:
    params = [(k, v) for k, v in request.query_params.multi_items() if k != "marker"]
    query = urlencode([*params, ("marker", marker)])
    return [{"rel": "next", "href": f"{links.compute(path)}?{query}"}]


async def _list(
    request: Request,
    *,
    pool: asyncpg.Pool,
    ctx: RequestContext,
    version: APIVersion,
    links: Links,
    down_time: float,
    detail: bool,
) -> dict[str, Any]:
    query = ServerQuery.from_request(request, ctx, version)
    async with pool.acquire() as conn:
        found = await _find_page(conn, query)
        view = await server_view(conn, ctx, version, links, down_time)
    body: dict[str, Any] = {
        "servers": [view.detail(i) if detail else view.summary(i) for i in found]
    }
    after = next_marker(found, query.paging, key=lambda i: str(i.uuid))
    if after is not None:
        path = "servers/detail" if detail else "servers"
        body["servers_links"] = _next_link(request, links, path, after)
    return body


@router.get("", openapi_extra=LIST_PARAMETERS)
async def list_servers(
    request: Request,
    *,
    pool: DbPool,
    ctx: Context,
    version: Version,
    links: RequestLinks,
    settings: AppSettings,
) -> dict[str, Any]:
    down_time = settings.service_down_time
    return await _list(
        request, pool=pool, ctx=ctx, version=version, links=links, down_time=down_time, detail=False
    )


@router.get("/detail", openapi_extra=LIST_PARAMETERS)
async def list_servers_detail(
    request: Request,
    *,
    pool: DbPool,
    ctx: Context,
    version: Version,
    links: RequestLinks,
    settings: AppSettings,
) -> dict[str, Any]:
    down_time = settings.service_down_time
    return await _list(
        request, pool=pool, ctx=ctx, version=version, links=links, down_time=down_time, detail=True
    )


async def find_instance(conn: Connection, ctx: RequestContext, server_id: str) -> Instance:
    """The caller's server ``server_id``; 404 if it does not exist or is another project's."""
    not_found = ItemNotFound(f"Instance {server_id} could not be found.")
    try:
        instance = await instances.get(conn, UUID(server_id))
    except (ValueError, InstanceNotFound):
        raise not_found from None
    if not ctx.is_admin and instance.project_id != ctx.project_id:
        raise not_found
    return instance


@router.get("/{server_id}")
async def show_server(
    server_id: str,
    *,
    pool: DbPool,
    ctx: Context,
    version: Version,
    links: RequestLinks,
    settings: AppSettings,
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        view = await server_view(conn, ctx, version, links, settings.service_down_time)
    return {"server": view.detail(instance, show=True)}


@router.post("", status_code=202)
async def create(
    body: NewServerBody,
    *,
    pool: DbPool,
    ctx: Context,
    conductor: Conductor,
    links: RequestLinks,
    response: Response,
) -> dict[str, Any]:
    instance = await create_server(pool, conductor, ctx, body.server)
    response.headers["Location"] = links.compute("servers", str(instance.uuid))
    return {"server": created_body(instance, links)}


@router.delete("/{server_id}", status_code=204, response_class=Response)
async def delete(
    server_id: str, pool: DbPool, ctx: Context, compute: Compute, settings: AppSettings
) -> Response:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    await delete_server(pool, compute, ctx, instance, settings.service_down_time)
    return Response(status_code=204)
