"""``/identity/v3/domains``: keel's one domain, ``Default`` (id ``default``), read-only.

Creating, changing or deleting a domain, and granting roles on one, are refused (403)
with a message saying why; listing a user's roles on the domain finds none.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.http.faults import Forbidden, ItemNotFound
from services.api.identity import filters, views
from shared.db import users
from shared.objects.identity import DEFAULT_DOMAIN_ID

router = APIRouter(prefix="/identity/v3")

DOMAIN_GRANT = "/domains/{domain_id}/users/{user_id}/roles/{role_id}"


def _known(domain_id: str) -> None:
    if domain_id != DEFAULT_DOMAIN_ID:
        raise ItemNotFound(f"Could not find domain: {domain_id}.")


def _read_only() -> Forbidden:
    return Forbidden("keel has one domain, Default, which cannot be created, changed or deleted.")


@router.get("/domains")
async def list_domains(request: Request, ctx: Context, links: RequestLinks) -> dict[str, Any]:
    name = request.query_params.get("name")
    found = [views.domain(links)]
    if name is not None:
        found = [d for d in found if d["name"] == name]
    return views.collection("domains", found, filters.self_url(request))


@router.get("/domains/{domain_id}")
async def show_domain(domain_id: str, ctx: Context, links: RequestLinks) -> dict[str, Any]:
    _known(domain_id)
    return {"domain": views.domain(links)}


@router.post("/domains", response_class=Response)
async def create_domain(ctx: Context) -> Response:
    raise _read_only()


@router.patch("/domains/{domain_id}", response_class=Response)
@router.delete("/domains/{domain_id}", response_class=Response)
async def change_domain(domain_id: str, ctx: Context) -> Response:
    _known(domain_id)
    raise _read_only()


@router.get("/domains/{domain_id}/users/{user_id}/roles")
async def list_domain_grants(
    domain_id: str, user_id: str, request: Request, ctx: Context, pool: DbPool
) -> dict[str, Any]:
    _known(domain_id)
    async with pool.acquire() as conn:
        await users.get(conn, user_id)
    return views.collection("roles", [], filters.self_url(request))


@router.put(DOMAIN_GRANT, response_class=Response)
async def grant_on_domain(domain_id: str, user_id: str, role_id: str, ctx: Context) -> Response:
    _known(domain_id)
    raise Forbidden("keel grants roles on projects only, not on the domain.")


@router.get(DOMAIN_GRANT, response_class=Response)
@router.head(DOMAIN_GRANT, response_class=Response)
@router.delete(DOMAIN_GRANT, response_class=Response)
async def domain_grant(domain_id: str, user_id: str, role_id: str, ctx: Context) -> Response:
    _known(domain_id)
    raise ItemNotFound(f"Could not find role assignment with role: {role_id}.")
