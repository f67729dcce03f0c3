"""``/identity/v3/users``: create, list, show, update and delete users; change a password.

Admins see and change every user. Anyone else sees only themselves (listing with a
``name`` filter finds them) and the projects they hold roles in. Passwords are stored as
slow salted hashes, never shown or logged. A user whose password changes, who is
disabled or who is deleted loses every token issued to them at once.

``POST /users/{id}/password`` needs no token, as in Keystone: the original password is
the proof.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.http.faults import Unauthorized
from services.api.identity import access, filters, views
from services.api.identity.bodies import PasswordBody, UserBody, UserPatch
from services.api.identity.tokens import PasswordUser, Verified, check_password
from shared.db import users
from shared.objects.identity import User, UserChanges
from shared.passwords import hash_password

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/identity/v3")


async def _hashed(password: str | None) -> str | None:
    return None if password is None else await asyncio.to_thread(hash_password, password)


@router.post("/users", status_code=201)
async def create_user(
    body: UserBody, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin(ctx, "create_user")
    given = body.user
    given.check()
    hashed = await _hashed(given.password)
    async with pool.acquire() as conn:
        made = await users.create(
            conn,
            given.name,
            hashed,
            default_project_id=given.default_project_id,
            enabled=given.enabled,
            extra=given.extras(),
        )
    LOG.info("created user %s (%s)", made.name, made.id)
    return {"user": views.user(made, links)}


@router.get("/users")
async def list_users(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    found: list[User] = []
    if not filters.other_domain(request):
        async with pool.acquire() as conn:
            found = await users.list_users(
                conn, name=request.query_params.get("name"), enabled=filters.enabled(request)
            )
    if not ctx.is_admin:
        found = [u for u in found if u.id == ctx.user_id]
    items = [views.user(u, links) for u in found]
    return views.collection("users", items, filters.self_url(request))


@router.get("/users/{user_id}")
async def show_user(
    user_id: str, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin_or_self(ctx, user_id, "get_user")
    async with pool.acquire() as conn:
        found = await users.get(conn, user_id)
    return {"user": views.user(found, links)}


@router.patch("/users/{user_id}")
async def update_user(
    user_id: str,
    body: UserPatch,
    ctx: Context,
    pool: DbPool,
    links: RequestLinks,
    *,
    verified: Verified,
) -> dict[str, Any]:
    access.admin(ctx, "update_user")
    given = body.user
    given.check()
    known = given.model_dump(include={"name", "enabled", "default_project_id"}, exclude_unset=True)
    if "password" in given.model_fields_set:
        known["password_hash"] = await _hashed(given.password)
    if given.extras():
        known["extra"] = given.extras()
    changes = UserChanges(**known)
    async with pool.acquire() as conn:
        updated = await users.update(conn, user_id, changes)
    if "password_hash" in known or given.enabled is False:
        # Never needed for safety (each login compares the stored hash and reads the
        # row), but there is no reason to keep it.
        verified.forget(updated.id)
        LOG.info("updated user %s (%s): their tokens are revoked", updated.name, updated.id)
    return {"user": views.user(updated, links)}


@router.delete("/users/{user_id}", status_code=204, response_class=Response)
async def delete_user(user_id: str, ctx: Context, pool: DbPool, verified: Verified) -> Response:
    access.admin(ctx, "delete_user")
    async with pool.acquire() as conn:
        found = await users.get(conn, user_id)
        await users.delete(conn, found)
    verified.forget(found.id)
    LOG.info("deleted user %s (%s)", found.name, found.id)
    return Response(status_code=204)


@router.post("/users/{user_id}/password", status_code=204, response_class=Response)
async def change_password(
    user_id: str, body: PasswordBody, pool: DbPool, verified: Verified
) -> Response:
    """The user's own password change: the original password authenticates it."""
    given = body.user
    async with pool.acquire() as conn:
        try:
            found = await check_password(
                conn, PasswordUser(id=user_id, password=given.original_password), verified
            )
        except Unauthorized:
            raise Unauthorized("The original password is not the user's password.") from None
    hashed = await _hashed(given.password)
    async with pool.acquire() as conn:
        await users.update(conn, found.id, UserChanges(password_hash=hashed))
    verified.forget(found.id)
    LOG.info("user %s (%s) changed their password", found.name, found.id)
    return Response(status_code=204)


@router.get("/users/{user_id}/projects")
async def list_user_projects(
    user_id: str, request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    access.admin_or_self(ctx, user_id, "list_user_projects")
    async with pool.acquire() as conn:
        await users.get(conn, user_id)
        found = await users.projects_of(conn, user_id)
    items = [views.project(p, links) for p in found]
    return views.collection("projects", items, filters.self_url(request))


@router.get("/users/{user_id}/groups")
async def list_user_groups(
    user_id: str, request: Request, ctx: Context, pool: DbPool
) -> dict[str, Any]:
    """keel has no groups: always empty."""
    access.admin_or_self(ctx, user_id, "list_groups_for_user")
    async with pool.acquire() as conn:
        await users.get(conn, user_id)
    return views.collection("groups", [], filters.self_url(request))
