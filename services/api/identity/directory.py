"""Projects, users and the domain, read-only: what clients need to resolve names.

Admins see every project and user. Anyone else sees only their own project and
themselves (listing them with a ``name`` filter finds them, as the client's name
look-ups expect); asking for another project or user by id is a 403.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from fastapi import APIRouter, Request

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.http.faults import Forbidden, ItemNotFound
from services.api.identity import views
from shared.context import RequestContext
from shared.db import projects, users
from shared.exceptions import ProjectNotFound, UserNotFound
from shared.objects.identity import DEFAULT_DOMAIN_ID, Project, User

router = APIRouter(prefix="/identity/v3")


def _self_url(request: Request) -> str:
    return str(request.url)


def _domain_filter_excludes(request: Request) -> bool:
    domain_id = request.query_params.get("domain_id")
    return domain_id is not None and domain_id != DEFAULT_DOMAIN_ID


def _visible_projects(ctx: RequestContext, found: list[Project]) -> list[Project]:
    return found if ctx.is_admin else [p for p in found if p.id == ctx.project_id]


def _visible_users(ctx: RequestContext, found: list[User]) -> list[User]:
    return found if ctx.is_admin else [u for u in found if u.id == ctx.user_id]


@router.get("/domains")
async def list_domains(request: Request, ctx: Context, links: RequestLinks) -> dict[str, Any]:
    name = request.query_params.get("name")
    found = [views.domain(links)]
    if name is not None:
        found = [d for d in found if d["name"] == name]
    return views.collection("domains", found, _self_url(request))


@router.get("/domains/{domain_id}")
async def show_domain(domain_id: str, ctx: Context, links: RequestLinks) -> dict[str, Any]:
    if domain_id != DEFAULT_DOMAIN_ID:
        raise ItemNotFound(f"Could not find domain: {domain_id}.")
    return {"domain": views.domain(links)}


@router.get("/projects")
async def list_projects(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    found: list[Project] = []
    if not _domain_filter_excludes(request):
        async with pool.acquire() as conn:
            found = await projects.list_projects(conn, name=request.query_params.get("name"))
    items = [views.project(p, links) for p in _visible_projects(ctx, found)]
    return views.collection("projects", items, _self_url(request))


@router.get("/projects/{project_id}")
async def show_project(
    project_id: str, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    if not ctx.is_admin and project_id != ctx.project_id:
        raise Forbidden("You are not authorized to see another project.")
    try:
        async with pool.acquire() as conn:
            found = await projects.get(conn, project_id)
    except ProjectNotFound as exc:
        raise ItemNotFound(exc.message) from None
    return {"project": views.project(found, links)}


@router.get("/users")
async def list_users(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    found: list[User] = []
    if not _domain_filter_excludes(request):
        async with pool.acquire() as conn:
            found = await users.list_users(conn, name=request.query_params.get("name"))
    items = [views.user(u, links) for u in _visible_users(ctx, found)]
    return views.collection("users", items, _self_url(request))


@router.get("/users/{user_id}")
async def show_user(
    user_id: str, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    if not ctx.is_admin and user_id != ctx.user_id:
        raise Forbidden("You are not authorized to see another user.")
    try:
        async with pool.acquire() as conn:
            found = await users.get(conn, user_id)
    except UserNotFound as exc:
        raise ItemNotFound(exc.message) from None
    return {"user": views.user(found, links)}


async def _projects_of(pool: asyncpg.Pool, user_id: str | None) -> list[Project]:
    if user_id is None:
        return []
    async with pool.acquire() as conn:
        return [m.project for m in await users.memberships(conn, user_id=user_id)]


@router.get("/users/{user_id}/projects")
async def list_user_projects(
    user_id: str, request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    if not ctx.is_admin and user_id != ctx.user_id:
        raise Forbidden("You are not authorized to see another user's projects.")
    items = [views.project(p, links) for p in await _projects_of(pool, user_id)]
    return views.collection("projects", items, _self_url(request))


@router.get("/auth/projects")
async def list_token_projects(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    items = [views.project(p, links) for p in await _projects_of(pool, ctx.user_id)]
    return views.collection("projects", items, _self_url(request))
