"""``/identity/v3/projects``: create, list, show, update and delete projects.

Admins see and change every project. Anyone else lists only the project their token is
scoped to (a ``name`` filter finds it, as the client's name look-ups expect) and may
show it; another project's id is a 403. A project disabled or deleted takes the tokens
scoped to it with it; one with servers that are not deleted cannot be deleted (409).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.identity import access, filters, views
from services.api.identity.bodies import ProjectBody, ProjectPatch
from shared.db import projects
from shared.objects.identity import Project

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/identity/v3")


@router.post("/projects", status_code=201)
async def create_project(
    body: ProjectBody, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "create_project")
    given = body.project
    given.check()
    async with pool.acquire() as conn:
        made = await projects.create(
            conn,
            given.name,
            given.description or "",
            enabled=given.enabled,
            extra=given.extras(),
        )
    LOG.info("created project %s (%s)", made.name, made.id)
    return {"project": views.project(made, links)}


@router.get("/projects")
async def list_projects(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    found: list[Project] = []
    if not filters.other_domain(request):
        async with pool.acquire() as conn:
            found = await projects.list_projects(
                conn, name=request.query_params.get("name"), enabled=filters.enabled(request)
            )
    if not ctx.is_admin:
        found = [p for p in found if p.id == ctx.project_id]
    items = [views.project(p, links) for p in found]
    return views.collection("projects", items, filters.self_url(request))


@router.get("/projects/{project_id}")
async def show_project(
    project_id: str, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin_or_own_project(ctx, project_id, "get_project")
    async with pool.acquire() as conn:
        found = await projects.get(conn, project_id)
    return {"project": views.project(found, links)}


@router.patch("/projects/{project_id}")
async def update_project(
    project_id: str, body: ProjectPatch, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "update_project")
    changes = body.project.changes()
    async with pool.acquire() as conn:
        updated = await projects.update(conn, project_id, changes)
    if changes.enabled is False:
        LOG.info("disabled project %s (%s): its tokens are revoked", updated.name, updated.id)
    return {"project": views.project(updated, links)}


@router.delete("/projects/{project_id}", status_code=204, response_class=Response)
async def delete_project(project_id: str, ctx: Context, pool: DbPool) -> Response:
    access.admin(ctx, "delete_project")
    async with pool.acquire() as conn:
        found = await projects.get(conn, project_id)
        await projects.delete(conn, found)
    LOG.info("deleted project %s (%s)", found.name, found.id)
    return Response(status_code=204)
