"""``/identity/v3/roles``: create, list, show, update and delete roles (admins only).

Role names are unique whatever their case. Deleting a role takes its assignments with
it, and with them the tokens that needed them. keel has no domain-specific roles.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.identity import access, filters, views
from services.api.identity.bodies import RoleBody, RolePatch
from shared.db import roles
from shared.objects.identity import Role

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/identity/v3")


@router.post("/roles", status_code=201)
async def create_role(
    body: RoleBody, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "create_role")
    given = body.role
    given.check()
    async with pool.acquire() as conn:
        made = await roles.create(
            conn, given.name, description=given.description, extra=given.extras()
        )
    LOG.info("created role %s (%s)", made.name, made.id)
    return {"role": views.role(made, links)}


@router.get("/roles")
async def list_roles(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "list_roles")
    found: list[Role] = []
    if request.query_params.get("domain_id") is None:
        async with pool.acquire() as conn:
            found = await roles.list_roles(conn, name=request.query_params.get("name"))
    items = [views.role(r, links) for r in found]
    return views.collection("roles", items, filters.self_url(request))


@router.get("/roles/{role_id}")
async def show_role(
    role_id: str, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "get_role")
    async with pool.acquire() as conn:
        found = await roles.get(conn, role_id)
    return {"role": views.role(found, links)}


@router.patch("/roles/{role_id}")
async def update_role(
    role_id: str, body: RolePatch, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "update_role")
    given = body.role
    given.check()
    async with pool.acquire() as conn:
        found = await roles.get(conn, role_id)
        updated = await roles.update(
            conn, found, name=given.name, description=given.description, extra=given.extras()
        )
    return {"role": views.role(updated, links)}


@router.delete("/roles/{role_id}", status_code=204, response_class=Response)
async def delete_role(role_id: str, ctx: Context, pool: DbPool) -> Response:
    access.admin(ctx, "delete_role")
    async with pool.acquire() as conn:
        found = await roles.get(conn, role_id)
        await roles.delete(conn, found)
    LOG.info("deleted role %s (%s) and its assignments", found.name, found.id)
    return Response(status_code=204)
