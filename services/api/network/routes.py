"""A read-only Networking API v2.0 under ``/network`` (the catalog's ``network`` service).

Enough for clients that expect Neutron beside Nova (openstacksdk's cloud layer, Ansible,
Tempest) to see how servers are connected: keel's address pool is one shared external
network (``router:external: true``) with one subnet, each address a server holds is a
port on it (``device_id`` the server), and there are no floating IPs (an empty list).
Members see their own servers' ports, admins every port. Each project has one security
group, ``default``, with no rules (keel's guests have no firewall): the one servers
show. Lists take Neutron's filters (``?name=private&router:external=true``, repeated
for several values, ``fixed_ips=ip_address=...``) and ``fields``. Nothing can be
created or changed here: keel's network is configured, not managed through an API (an
admin's delete of a default group, or of quotas, answers 204 and changes nothing).
Errors have Neutron's shape, ``{"NeutronError": {"type", "message", "detail"}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, Keystone, RequestLinks
from services.api.network.views import (
    network_view,
    port_view,
    security_group_view,
    subnet_view,
)
from shared.context import RequestContext
from shared.db import fixed_ips, instances
from shared.db import projects as identity_projects

router = APIRouter(prefix="/network")

#: Query parameters that page, sort or shape a list rather than filter it.
_NOT_FILTERS = {"fields", "limit", "marker", "sort_key", "sort_dir", "page_reverse"}
EXTENSIONS = [
    {
        "alias": "external-net",
        "name": "Neutron external network",
        "description": "Adds external network attribute to network resource.",
        "updated": "2013-01-14T10:00:00-00:00",
        "links": [],
    }
]


class NeutronError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message

    def response(self) -> JSONResponse:
        body = {"NeutronError": {"type": self.kind, "message": self.message, "detail": ""}}
        return JSONResponse(body, status_code=self.status)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _matches(item: dict[str, Any], name: str, wanted: list[str]) -> bool:
    value = item[name]
    if name == "fixed_ips":
        return any(
            all(
                _text(ip.get(key)) == expected
                for key, _, expected in (part.partition("=") for part in want.split(","))
            )
            for ip in value
            for want in wanted
        )
    if isinstance(value, bool):
        return _text(value) in {w.lower() for w in wanted}
    return _text(value) in wanted


def select(items: Iterable[dict[str, Any]], request: Request) -> list[dict[str, Any]]:
    """Neutron's list filters and ``fields`` applied to ``items``."""
    params = request.query_params
    shown = list(items)
    for name in {key for key in params if key not in _NOT_FILTERS}:
        if shown and name not in shown[0]:
            raise NeutronError(
                400, "HTTPBadRequest", f"[{name}] is invalid attribute for filtering"
            )
        shown = [item for item in shown if _matches(item, name, params.getlist(name))]
    fields = params.getlist("fields")
    if fields:
        shown = [{k: v for k, v in item.items() if k in fields} for item in shown]
    return shown


async def _listed(
    request: Request, collection: str, make: Callable[[], Any]
) -> dict[str, Any] | JSONResponse:
    try:
        return {collection: select(await make(), request)}
    except NeutronError as error:
        return error.response()


def _one(items: list[dict[str, Any]], item_id: str, kind: str) -> dict[str, Any] | JSONResponse:
    for item in items:
        if item["id"] == item_id:
            return {kind.lower(): item}
    return NeutronError(404, f"{kind}NotFound", f"{kind} {item_id} could not be found.").response()


@router.get("")
@router.get("/")
async def versions(links: RequestLinks) -> dict[str, Any]:
    href = links.bookmark("network", "v2.0") + "/"
    return {
        "versions": [{"id": "v2.0", "status": "CURRENT", "links": [{"rel": "self", "href": href}]}]
    }


@router.get("/v2.0")
@router.get("/v2.0/")
async def resources(ctx: Context, links: RequestLinks) -> dict[str, Any]:
    names = {
        "network": "networks",
        "subnet": "subnets",
        "port": "ports",
        "security_group": "security-groups",
        "floatingip": "floatingips",
    }
    return {
        "resources": [
            {
                "name": name,
                "collection": collection,
                "links": [{"rel": "self", "href": links.bookmark("network", "v2.0", collection)}],
            }
            for name, collection in names.items()
        ]
    }


@router.get("/v2.0/extensions")
async def extensions(ctx: Context) -> dict[str, Any]:
    return {"extensions": EXTENSIONS}


@router.get("/v2.0/extensions/{alias}", response_model=None)
async def extension(alias: str, ctx: Context) -> dict[str, Any] | JSONResponse:
    for found in EXTENSIONS:
        if found["alias"] == alias:
            return {"extension": found}
    return NeutronError(
        404, "HTTPNotFound", f"Extension with alias {alias} does not exist"
    ).response()


@router.get("/v2.0/networks", response_model=None)
async def list_networks(
    request: Request, ctx: Context, settings: AppSettings
) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        return [network_view(settings.network, is_admin=ctx.is_admin)]

    return await _listed(request, "networks", make)


@router.get("/v2.0/networks/{network_id}", response_model=None)
async def show_network(
    network_id: str, ctx: Context, settings: AppSettings
) -> dict[str, Any] | JSONResponse:
    return _one([network_view(settings.network, is_admin=ctx.is_admin)], network_id, "Network")


@router.get("/v2.0/subnets", response_model=None)
async def list_subnets(
    request: Request, ctx: Context, settings: AppSettings
) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        return [subnet_view(settings.network)]

    return await _listed(request, "subnets", make)


@router.get("/v2.0/subnets/{subnet_id}", response_model=None)
async def show_subnet(
    subnet_id: str, ctx: Context, settings: AppSettings
) -> dict[str, Any] | JSONResponse:
    return _one([subnet_view(settings.network)], subnet_id, "Subnet")


async def _ports(pool: DbPool, ctx: Context) -> list[dict[str, Any]]:
    async with pool.acquire() as conn:
        held = await fixed_ips.held_addresses(conn, None if ctx.is_admin else ctx.project_id)
    return [port_view(address, is_admin=ctx.is_admin) for address in held]


@router.get("/v2.0/ports", response_model=None)
async def list_ports(request: Request, pool: DbPool, ctx: Context) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        return await _ports(pool, ctx)

    return await _listed(request, "ports", make)


@router.get("/v2.0/ports/{port_id}", response_model=None)
async def show_port(port_id: str, pool: DbPool, ctx: Context) -> dict[str, Any] | JSONResponse:
    return _one(await _ports(pool, ctx), port_id, "Port")


@router.get("/v2.0/floatingips")
async def list_floating_ips(ctx: Context) -> dict[str, Any]:
    return {"floatingips": []}


@router.get("/v2.0/floatingips/{floating_ip_id}", response_model=None)
async def show_floating_ip(floating_ip_id: str, ctx: Context) -> JSONResponse:
    return NeutronError(
        404, "FloatingIPNotFound", f"Floating IP {floating_ip_id} could not be found"
    ).response()


def _group_projects(ctx: RequestContext, request: Request | None) -> set[str]:
    """Whose default security groups the caller may see: their project's, and for
    admins the projects a ``project_id``/``tenant_id`` filter names."""
    found = {ctx.project_id or ""}
    if ctx.is_admin and request is not None:
        params = request.query_params
        found |= set(params.getlist("project_id")) | set(params.getlist("tenant_id"))
    return found


@router.get("/v2.0/security-groups", response_model=None)
async def list_security_groups(request: Request, ctx: Context) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        return [security_group_view(p) for p in sorted(_group_projects(ctx, request))]

    return await _listed(request, "security_groups", make)


@router.get("/v2.0/security-groups/{group_id}", response_model=None)
async def show_security_group(
    group_id: str, pool: DbPool, ctx: Context
) -> dict[str, Any] | JSONResponse:
    projects = _group_projects(ctx, None)
    if ctx.is_admin:
        async with pool.acquire() as conn:
            projects |= set(await instances.live_projects(conn))
    for project_id in sorted(projects):
        group = security_group_view(project_id)
        if group["id"] == group_id:
            return {"security_group": group}
    return NeutronError(
        404, "SecurityGroupNotFound", f"Security group {group_id} does not exist"
    ).response()


@router.delete("/v2.0/security-groups/{group_id}", response_model=None)
async def delete_security_group(
    group_id: str, pool: DbPool, ctx: Context, keystone: Keystone
) -> Response | JSONResponse:
    """A project's default group cannot go: an admin's delete changes nothing and answers
    204, as Neutron's does (its default group comes back when the project next looks;
    Tempest's dynamic credentials clean up this way); anyone else gets Neutron's 409."""
    projects = _group_projects(ctx, None)
    if ctx.is_admin:
        async with pool.acquire() as conn:
            projects |= set(await instances.live_projects(conn))
            if keystone is None:
                projects |= {p.id for p in await identity_projects.list_projects(conn)}
    if not any(security_group_view(p)["id"] == group_id for p in projects):
        return NeutronError(
            404, "SecurityGroupNotFound", f"Security group {group_id} does not exist"
        ).response()
    if not ctx.is_admin:
        return NeutronError(
            409,
            "SecurityGroupCannotRemoveDefault",
            "Insufficient rights for removing default security group.",
        ).response()
    return Response(status_code=204)


#: Networking quotas as keel has them: no network, subnet, router, floating IP, subnet
#: pool or RBAC policy can be created (0); ports (one per server address) and security
#: groups are bounded by the compute quotas, not here (-1, unlimited).
QUOTAS = {
    "network": 0,
    "subnet": 0,
    "subnetpool": 0,
    "router": 0,
    "floatingip": 0,
    "rbac_policy": 0,
    "port": -1,
    "security_group": -1,
    "security_group_rule": -1,
}


def _others_quota(ctx: RequestContext, project_id: str) -> JSONResponse | None:
    """403 for a member asking about another project's quota; ``None`` when allowed."""
    if ctx.is_admin or project_id == ctx.project_id:
        return None
    return NeutronError(
        403, "HTTPForbidden", "Not authorized to see another project's quota"
    ).response()


@router.get("/v2.0/quotas", response_model=None)
async def list_quotas(ctx: Context) -> dict[str, Any]:
    """Only projects with quotas set differ from the defaults: none do here."""
    return {"quotas": []}


@router.get("/v2.0/quotas/{project_id}/default", response_model=None)
@router.get("/v2.0/quotas/{project_id}/default.json", response_model=None)
async def default_quota(project_id: str, ctx: Context) -> dict[str, Any]:
    return {"quota": dict(QUOTAS)}


@router.get("/v2.0/quotas/{project_id}/details", response_model=None)
@router.get("/v2.0/quotas/{project_id}/details.json", response_model=None)
async def quota_details(
    project_id: str, ctx: Context, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    if (refused := _others_quota(ctx, project_id)) is not None:
        return refused
    async with pool.acquire() as conn:
        ports = await fixed_ips.count_for_project(conn, project_id)
    used = {name: 0 for name in QUOTAS} | {"port": ports}
    return {
        "quota": {
            name: {"limit": limit, "used": used[name], "reserved": 0}
            for name, limit in QUOTAS.items()
        }
    }


@router.get("/v2.0/quotas/{project_id}", response_model=None)
@router.get("/v2.0/quotas/{project_id}.json", response_model=None)
async def show_quota(project_id: str, ctx: Context) -> dict[str, Any] | JSONResponse:
    if (refused := _others_quota(ctx, project_id)) is not None:
        return refused
    return {"quota": dict(QUOTAS)}


@router.delete("/v2.0/quotas/{project_id}", response_model=None, status_code=204)
async def reset_quota(project_id: str, ctx: Context) -> Response | JSONResponse:
    """Nothing to reset: every project has the defaults. Admins only, as in Neutron."""
    if not ctx.is_admin:
        return NeutronError(403, "HTTPForbidden", "Only admins may reset quotas").response()
    return Response(status_code=204)


@router.put("/v2.0/quotas/{project_id}", response_model=None)
async def update_quota(project_id: str, ctx: Context) -> JSONResponse:
    return NeutronError(
        400,
        "HTTPBadRequest",
        "keel's network is configured, not managed: its quotas cannot be changed",
    ).response()
