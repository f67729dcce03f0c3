"""Role grants on projects, and ``/identity/v3/role_assignments``.

``PUT /projects/{p}/users/{u}/roles/{r}`` gives a user a role in a project (again: no
change), ``DELETE`` takes it away (revoking the user's tokens for that project),
``HEAD``/``GET`` check it (204 or 404), and ``GET /projects/{p}/users/{u}/roles``
lists the roles assigned. Granting and revoking need the admin role; a user may check
and list their own.

``GET /role_assignments`` lists assignments, filtered by ``user.id``, ``role.id`` and
``scope.project.id``; ``effective`` adds the roles the assigned ones imply (each linked
to its ``prior_role``), ``include_names`` the names. keel has no groups, no domain or
system assignments and no inheritance, so filters on those match nothing. An admin sees
every assignment, anyone else only their own (``user.id`` naming themselves).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.http.faults import ItemNotFound
from services.api.http.links import Links
from services.api.identity import access, filters, views
from shared.db import projects, role_assignments, roles, users
from shared.db.pool import Connection
from shared.db.role_assignments import Assignment
from shared.objects.identity import DEFAULT_DOMAIN_ID, DEFAULT_DOMAIN_NAME, Role

router = APIRouter(prefix="/identity/v3")

GRANT = "/projects/{project_id}/users/{user_id}/roles/{role_id}"
#: Filters that name what keel has none of: with any of them, nothing matches.
_NOTHING_MATCHES = ("group.id", "scope.domain.id", "scope.system", "scope.OS-INHERIT:inherited_to")


async def _check_refs(conn: Connection, project_id: str, user_id: str, role_id: str) -> None:
    """404 for whichever of the three does not exist."""
    await projects.get(conn, project_id)
    await users.get(conn, user_id)
    await roles.get(conn, role_id)


def _no_assignment(role_id: str) -> ItemNotFound:
    return ItemNotFound(f"Could not find role assignment with role: {role_id}.")


@router.put(GRANT, status_code=204, response_class=Response)
async def grant(
    project_id: str, user_id: str, role_id: str, ctx: Context, pool: DbPool
) -> Response:
    access.admin(ctx, "create_grant")
    async with pool.acquire() as conn:
        await _check_refs(conn, project_id, user_id, role_id)
        await role_assignments.grant(conn, user_id, project_id, role_id)
    return Response(status_code=204)


@router.get(GRANT, status_code=204, response_class=Response)
@router.head(GRANT, status_code=204, response_class=Response)
async def check(
    project_id: str, user_id: str, role_id: str, ctx: Context, pool: DbPool
) -> Response:
    access.admin_or_self(ctx, user_id, "check_grant")
    async with pool.acquire() as conn:
        await _check_refs(conn, project_id, user_id, role_id)
        held = await role_assignments.holds(conn, user_id, project_id, role_id)
    if not held:
        raise _no_assignment(role_id)
    return Response(status_code=204)


@router.delete(GRANT, status_code=204, response_class=Response)
async def revoke(
    project_id: str, user_id: str, role_id: str, ctx: Context, pool: DbPool
) -> Response:
    access.admin(ctx, "revoke_grant")
    async with pool.acquire() as conn:
        await _check_refs(conn, project_id, user_id, role_id)
        if not await role_assignments.revoke(conn, user_id, project_id, role_id):
            raise _no_assignment(role_id)
    return Response(status_code=204)


@router.get("/projects/{project_id}/users/{user_id}/roles")
async def list_grants(
    project_id: str,
    user_id: str,
    *,
    request: Request,
    ctx: Context,
    pool: DbPool,
    links: RequestLinks,
) -> dict[str, Any]:
    access.admin_or_self(ctx, user_id, "list_grants")
    async with pool.acquire() as conn:
        await projects.get(conn, project_id)
        await users.get(conn, user_id)
        found = await role_assignments.list_assignments(
            conn, user_id=user_id, project_id=project_id
        )
        held = [await roles.get(conn, a.role_id) for a in found]
    items = [views.role(r, links) for r in held]
    return views.collection("roles", items, filters.self_url(request))


def _entry(
    item: Assignment, role: Role, links: Links, names: bool, prior: str | None = None
) -> dict[str, Any]:
    domain = {"id": DEFAULT_DOMAIN_ID, "name": DEFAULT_DOMAIN_NAME}
    assignment = links.bookmark(
        "identity",
        "v3",
        "projects",
        item.project_id,
        "users",
        item.user_id,
        "roles",
        prior or role.id,
    )
    entry: dict[str, Any] = {
        "role": {"id": role.id},
        "user": {"id": item.user_id},
        "scope": {"project": {"id": item.project_id}},
        "links": {"assignment": assignment},
    }
    if prior is not None:
        entry["links"]["prior_role"] = links.bookmark("identity", "v3", "roles", prior)
    if names:
        entry["role"]["name"] = role.name
        entry["user"].update(name=item.user_name, domain=domain)
        entry["scope"]["project"].update(name=item.project_name, domain=domain)
    return entry


async def _entries(
    conn: Connection, found: list[Assignment], links: Links, effective: bool, names: bool
) -> list[dict[str, Any]]:
    entries = []
    implied = await roles.implied_by(conn, [a.role_id for a in found]) if effective else {}
    for item in found:
        role = Role(id=item.role_id, name=item.role_name)
        entries.append(_entry(item, role, links, names))
        for more in implied.get(item.role_id, []):
            entries.append(_entry(item, more, links, names, prior=item.role_id))
    return entries


@router.get("/role_assignments")
async def list_role_assignments(
    request: Request, ctx: Context, pool: DbPool, links: RequestLinks
) -> dict[str, Any]:
    query = request.query_params
    user_id = query.get("user.id")
    if not ctx.is_admin and (user_id is None or user_id != ctx.user_id):
        raise access.refused("list_role_assignments")
    entries: list[dict[str, Any]] = []
    if not any(name in query for name in _NOTHING_MATCHES):
        effective = filters.flag(request, "effective")
        role_id = query.get("role.id")
        async with pool.acquire() as conn:
            found = await role_assignments.list_assignments(
                conn,
                user_id=user_id,
                project_id=query.get("scope.project.id"),
                role_id=None if effective else role_id,
            )
            entries = await _entries(
                conn, found, links, effective, filters.flag(request, "include_names")
            )
        if effective and role_id is not None:
            entries = [e for e in entries if e["role"]["id"] == role_id]
    return views.collection("role_assignments", entries, filters.self_url(request))
