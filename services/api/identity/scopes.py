"""What a token may be scoped to, and its catalog: ``/identity/v3/auth/{projects,domains,catalog}``.

The caller's enabled projects (those they hold a role in); no domains (keel scopes tokens
to projects only); the same service catalog a token carries.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, RequestLinks
from services.api.identity import filters, views
from shared.db import users

router = APIRouter(prefix="/identity/v3/auth")


@router.get("/projects")
async def list_token_projects(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    found = []
    if ctx.user_id is not None:
        async with pool.acquire() as conn:
            found = await users.projects_of(conn, ctx.user_id, enabled_only=True)
    items = [views.project(p, links) for p in found]
    return views.collection("projects", items, filters.self_url(request))


@router.get("/domains")
async def list_token_domains(request: Request, ctx: Context) -> dict[str, Any]:
    return views.collection("domains", [], filters.self_url(request))


@router.get("/catalog")
async def show_catalog(
    request: Request, ctx: Context, settings: AppSettings, links: RequestLinks
) -> dict[str, Any]:
    catalog = views.catalog(links, settings.identity.region)
    return {"catalog": catalog, "links": {"self": filters.self_url(request)}}
