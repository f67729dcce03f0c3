"""Security groups in the Networking API (``/v2.0/security-groups``).

Every project has its ``default`` group (not stored: its id derives from the project);
projects create, rename and delete others. keel filters no traffic: groups are recorded,
servers are put in and taken out of them (``addSecurityGroup``/``removeSecurityGroup``)
and both APIs show them, but a group has no rules and ``POST /v2.0/security-group-rules``
is refused with a 400 that says so, rather than accepting rules nothing would enforce.

A group a server that is not deleted is in cannot be deleted (409). A default group
cannot be deleted by its members (409); an admin's delete of one answers 204 and changes
nothing, as Neutron's default group comes back when the project next looks (Tempest's
dynamic credentials clean up this way).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.api.http.auth import Context
from services.api.http.deps import DbPool, Keystone
from services.api.network.managed import bad, body_of, name_of, owner
from services.api.network.routes import NeutronError, listed
from services.api.network.views import group_view, security_group_view
from shared.context import RequestContext
from shared.db import instances, security_groups
from shared.db import projects as identity_projects
from shared.db.pool import Connection
from shared.db.security_groups import GroupInUse, GroupNameRefused, SecurityGroup
from shared.db.transaction import in_transaction

router = APIRouter(prefix="/network/v2.0")

_GROUP_KEYS = {"name", "description", "tenant_id", "project_id", "stateful"}
_NO_RULES = (
    "keel filters no traffic (its guests have no firewall): security groups are recorded "
    "and shown, but rules cannot be created."
)


def _group_projects(ctx: RequestContext, request: Request | None) -> set[str]:
    """Whose default security groups the caller may see: their project's, and for
    admins the projects a ``project_id``/``tenant_id`` filter names."""
    found = {ctx.project_id or ""}
    if ctx.is_admin and request is not None:
        params = request.query_params
        found |= set(params.getlist("project_id")) | set(params.getlist("tenant_id"))
    return found


def _not_found(group_id: str) -> JSONResponse:
    return NeutronError(
        404, "SecurityGroupNotFound", f"Security group {group_id} does not exist"
    ).response()


def _mine(ctx: RequestContext, group: SecurityGroup | None) -> SecurityGroup | None:
    if group is None or not (ctx.is_admin or group.project_id == ctx.project_id):
        return None
    return group


def _uuid(value: str) -> UUID | None:
    try:
        return UUID(value)
    except ValueError:
        return None


@router.get("/security-groups", response_model=None)
async def list_security_groups(
    request: Request, ctx: Context, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        defaults = [security_group_view(p) for p in sorted(_group_projects(ctx, request))]
        async with pool.acquire() as conn:
            created = await security_groups.list_created(
                conn, None if ctx.is_admin else [ctx.project_id or ""]
            )
        return defaults + [group_view(group) for group in created]

    return await listed(request, "security_groups", make)


@router.get("/security-groups/{group_id}", response_model=None)
async def show_security_group(
    group_id: str, pool: DbPool, ctx: Context
) -> dict[str, Any] | JSONResponse:
    projects = _group_projects(ctx, None)
    async with pool.acquire() as conn:
        wanted = _uuid(group_id)
        created = None if wanted is None else await security_groups.get_created(conn, wanted)
        if _mine(ctx, created) is not None:
            assert created is not None
            return {"security_group": group_view(created)}
        if ctx.is_admin:
            projects |= set(await instances.live_projects(conn))
    for project_id in sorted(projects):
        group = security_group_view(project_id)
        if group["id"] == group_id:
            return {"security_group": group}
    return _not_found(group_id)


@router.post("/security-groups", response_model=None, status_code=201)
async def create_security_group(
    request: Request, ctx: Context, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    try:
        given = await body_of(request, "security_group", _GROUP_KEYS)
        project_id = owner(ctx, given)
        name = name_of(given)
        description = given.get("description") or ""
        if not isinstance(description, str) or len(description) > 255:
            raise bad("Invalid input for description: a string of at most 255 characters.")
        if given.get("stateful", True) is not True:
            raise bad("keel's security groups are stateful: stateful must be true.")
    except NeutronError as error:
        return error.response()

    async def create(conn: Connection) -> SecurityGroup:
        return await security_groups.create(conn, project_id, name, description)

    try:
        group = await in_transaction(pool, create, what=f"creating security group {name!r}")
    except GroupNameRefused as exc:
        return NeutronError(409, "SecurityGroupDefaultAlreadyExists", exc.message).response()
    return {"security_group": group_view(group)}


@router.put("/security-groups/{group_id}", response_model=None)
async def update_security_group(
    group_id: str, request: Request, ctx: Context, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    try:
        given = await body_of(request, "security_group", {"name", "description"})
        name = name_of(given) if "name" in given else None
        description = given.get("description")
        if description is not None and (not isinstance(description, str) or len(description) > 255):
            raise bad("Invalid input for description: a string of at most 255 characters.")
    except NeutronError as error:
        return error.response()
    if group_id == str(security_groups.default_group_id(ctx.project_id or "")):
        return NeutronError(
            409, "SecurityGroupCannotUpdateDefault", "Updating default security group not allowed."
        ).response()
    wanted = _uuid(group_id)
    if wanted is None:
        return _not_found(group_id)

    async def change(conn: Connection) -> SecurityGroup | None:
        if _mine(ctx, await security_groups.get_created(conn, wanted)) is None:
            return None
        return await security_groups.update(conn, wanted, name=name, description=description)

    try:
        group = await in_transaction(pool, change, what=f"updating security group {group_id}")
    except GroupNameRefused as exc:
        return bad(exc.message).response()
    return _not_found(group_id) if group is None else {"security_group": group_view(group)}


@router.delete("/security-groups/{group_id}", response_model=None)
async def delete_security_group(
    group_id: str, pool: DbPool, ctx: Context, keystone: Keystone
) -> Response | JSONResponse:
    wanted = _uuid(group_id)

    async def delete(conn: Connection) -> bool | None:
        """True: deleted; False: not a created group of the caller's; None: not found."""
        if wanted is None:
            return None
        if _mine(ctx, await security_groups.get_created(conn, wanted)) is None:
            return False
        return await security_groups.delete(conn, wanted) or None

    try:
        deleted = await in_transaction(pool, delete, what=f"deleting security group {group_id}")
    except GroupInUse as exc:
        return NeutronError(409, "SecurityGroupInUse", exc.message).response()
    if deleted:
        return Response(status_code=204)
    return await _delete_default(group_id, pool, ctx, keystone)


async def _delete_default(
    group_id: str, pool: DbPool, ctx: RequestContext, keystone: Keystone
) -> Response | JSONResponse:
    projects = _group_projects(ctx, None)
    if ctx.is_admin:
        async with pool.acquire() as conn:
            projects |= set(await instances.live_projects(conn))
            if keystone is None:
                projects |= {p.id for p in await identity_projects.list_projects(conn)}
    if not any(security_group_view(p)["id"] == group_id for p in projects):
        return _not_found(group_id)
    if not ctx.is_admin:
        return NeutronError(
            409,
            "SecurityGroupCannotRemoveDefault",
            "Insufficient rights for removing default security group.",
        ).response()
    return Response(status_code=204)


@router.get("/security-group-rules", response_model=None)
async def list_security_group_rules(
    request: Request, ctx: Context
) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        return []

    return await listed(request, "security_group_rules", make)


@router.get("/security-group-rules/{rule_id}", response_model=None)
async def show_security_group_rule(rule_id: str, ctx: Context) -> JSONResponse:
    return NeutronError(
        404, "SecurityGroupRuleNotFound", f"Security group rule {rule_id} does not exist"
    ).response()


@router.post("/security-group-rules", response_model=None)
async def create_security_group_rule(ctx: Context) -> JSONResponse:
    return bad(_NO_RULES).response()
