"""Servers: create, list (summary and detail), show, delete.

Members see their own project's servers. Admins see their own project's unless they
ask for ``all_tenants`` (optionally narrowed by ``project_id``/``tenant_id``). The list's
filters and sort keys are read by :mod:`services.api.servers.filters`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import asyncpg
from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import (
    AppPolicy,
    AppSettings,
    Compute,
    Conductor,
    DbPool,
    RequestLinks,
    SchedulerCap,
    Version,
)
from services.api.http.faults import BadRequest
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.http.paging import marker_not_found, next_marker
from services.api.servers import group_hint, locks, soft_delete
from services.api.servers.create import NewServerBody, create_server
from services.api.servers.fields import prepare
from services.api.servers.filters import server_search
from services.api.servers.lookup import find_instance, last_segment, server_view
from services.api.servers.views import created_body
from shared.context import RequestContext
from shared.db import instance_search
from shared.db.instance_search import InstanceSearch
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance

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
        _query("flavor", "the id of the servers' flavor"),
        _query("image", "the id of the servers' image"),
        _query("availability_zone", "the zone the servers are in"),
        _query("changes-since", "servers changed at or after this ISO 8601 time"),
        _query("sort_key", "what to sort by", many=True),
        _query("sort_dir", "asc or desc, one per sort_key", many=True),
        _query("limit", "at most this many servers"),
        _query("marker", "the id of the server before the page"),
    ]
}


async def _find_page(conn: Connection, search: InstanceSearch) -> list[Instance]:
    try:
        return await instance_search.search(conn, search)
    except InstanceNotFound:
        raise marker_not_found(str(search.marker)) from None
    except asyncpg.InvalidRegularExpressionError as exc:
        raise BadRequest(f"Invalid regular expression in a filter: {exc}") from None


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
    forward_name: str | None,
    max_limit: int,
    detail: bool,
) -> dict[str, Any]:
    search, paging = server_search(request.query_params, ctx, version, max_limit=max_limit)
    async with pool.acquire() as conn:
        found = await _find_page(conn, search)
        view = await server_view(
            conn, ctx, version, links, down_time, shown=found, forward_name=forward_name
        )
    body: dict[str, Any] = {
        "servers": [view.detail(i) if detail else view.summary(i) for i in found]
    }
    after = next_marker(found, paging, key=lambda i: str(i.uuid))
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
    return await _list(
        request,
        pool=pool,
        ctx=ctx,
        version=version,
        links=links,
        down_time=settings.service_down_time,
        forward_name=settings.network.forward_name,
        max_limit=settings.api.max_limit,
        detail=False,
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
    return await _list(
        request,
        pool=pool,
        ctx=ctx,
        version=version,
        links=links,
        down_time=settings.service_down_time,
        forward_name=settings.network.forward_name,
        max_limit=settings.api.max_limit,
        detail=True,
    )


@router.get("/{server_id}", dependencies=[NO_QUERY_FROM_2_102])
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
        view = await server_view(
            conn,
            ctx,
            version,
            links,
            settings.service_down_time,
            shown=[instance],
            forward_name=settings.network.forward_name,
        )
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
    version: Version,
    settings: AppSettings,
    policy: AppPolicy,
    scheduler_cap: SchedulerCap,
) -> dict[str, Any]:
    server = body.server
    group_hint.check_schedulers(body.hints(), scheduler_cap)
    fields = prepare(server, last_segment(server.image_ref), version, settings.network)
    created = await create_server(
        pool,
        conductor,
        ctx,
        server,
        fields=fields,
        quota=settings.quota,
        policy=policy,
        version=version,
        hints=body.hints(),
    )
    if server.return_reservation_id:
        return {"reservation_id": created[0].reservation_id}
    response.headers["Location"] = links.compute("servers", str(created[0].uuid))
    return {"server": created_body(created[0], links, fields.admin_pass, fields.security_groups)}


@router.delete("/{server_id}", status_code=204, response_class=Response)
async def delete(
    server_id: str,
    *,
    pool: DbPool,
    ctx: Context,
    compute: Compute,
    conductor: Conductor,
    settings: AppSettings,
) -> Response:
    """Delete the server, or soft-delete it (see :mod:`services.api.servers.soft_delete`)."""
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    locks.check_unlocked(ctx, instance)
    await soft_delete.delete(
        pool, compute, conductor, settings=settings, ctx=ctx, instance=instance
    )
    return Response(status_code=204)
