"""``os-flavor-access`` (admin): which projects may use a private flavor.

``GET /flavors/{id}/os-flavor-access`` lists them (404 for a public flavor: it has no
list); ``POST /flavors/{id}/action`` with ``addTenantAccess`` or ``removeTenantAccess``
(``{"tenant": PROJECT}``) changes it and answers the list. A project already on it is
409, one not on it 404; a public flavor takes no project (409), as in Nova from 2.7.
Members of a project on the list see the flavor, list it and create servers with it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from services.api.http.auth import AdminContext
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, Version
from services.api.http.faults import BadRequest, ConflictingRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from shared.db import flavors
from shared.db.pool import Connection
from shared.exceptions import FlavorNotFound
from shared.objects.flavor import Flavor

router = APIRouter(prefix="/v2.1/flavors")


async def _flavor(conn: Connection, flavor_id: str) -> Flavor:
    try:
        return await flavors.get(conn, flavor_id)
    except FlavorNotFound as exc:
        raise ItemNotFound(exc.message) from None


async def _listing(conn: Connection, flavor: Flavor) -> dict[str, Any]:
    return {
        "flavor_access": [
            {"flavor_id": flavor.flavorid, "tenant_id": project}
            for project in await flavors.access_list(conn, flavor)
        ]
    }


@router.get("/{flavor_id}/os-flavor-access", dependencies=[NO_QUERY_FROM_2_102])
async def list_access(flavor_id: str, pool: DbPool, ctx: AdminContext) -> dict[str, Any]:
    async with pool.acquire() as conn:
        flavor = await _flavor(conn, flavor_id)
        if flavor.is_public:
            raise ItemNotFound("Access list not available for public flavors.")
        return await _listing(conn, flavor)


def _tenant(value: Any, action: str) -> str:
    tenant = value.get("tenant") if isinstance(value, dict) else None
    if not isinstance(tenant, str) or not 1 <= len(tenant) <= 255 or set(value) != {"tenant"}:
        raise BadRequest(f"Invalid input for field/attribute {action}: it needs one 'tenant'.")
    return tenant


async def _change(
    conn: Connection, flavor: Flavor, action: str, tenant: str, version: APIVersion
) -> None:
    if action == "addTenantAccess":
        if flavor.is_public and version.at_least("2.7"):
            raise ConflictingRequest(f"Can not add access to a public flavor {flavor.flavorid}.")
        if not await flavors.add_access(conn, flavor, tenant):
            raise ConflictingRequest(
                f"Flavor access already exists for flavor {flavor.flavorid} and project "
                f"{tenant} combination."
            )
    elif not await flavors.remove_access(conn, flavor, tenant):
        raise ItemNotFound(f"Flavor access not found for {flavor.flavorid} / {tenant} combination.")


@router.post("/{flavor_id}/action")
async def flavor_action(
    flavor_id: str,
    body: Annotated[dict[str, Any], Body()],
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
) -> dict[str, Any]:
    if len(body) != 1:
        raise BadRequest("The request body must name exactly one action.")
    ((action, value),) = body.items()
    if action not in ("addTenantAccess", "removeTenantAccess"):
        raise BadRequest(f"There is no such action: {action[:100]}")
    tenant = _tenant(value, action)
    async with pool.acquire() as conn, conn.transaction():
        flavor = await _flavor(conn, flavor_id)
        await _change(conn, flavor, action, tenant, version)
        return await _listing(conn, flavor)
