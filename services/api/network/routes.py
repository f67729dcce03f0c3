"""The Networking API v2.0 under ``/network`` (the catalog's ``network`` service).

Enough of Neutron for clients that expect it beside Nova (openstacksdk's cloud layer,
Ansible, Tempest, the ``openstack`` CLI): keel's configured address pool is one shared
external network (``router:external: true``) with one subnet; projects create networks
with one IPv4 subnet each (:mod:`services.api.network.managed`) and security groups
(:mod:`services.api.network.groups`); each address a server holds is a port (``device_id``
the server), and there are no floating IPs (an empty list). Members see their own
servers' ports, admins every port. Lists take Neutron's filters
(``?name=private&router:external=true``, repeated for several values,
``fixed_ips=ip_address=...``) and ``fields``. Errors have Neutron's shape,
``{"NeutronError": {"type", "message", "detail"}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.api.http.auth import Context
from services.api.http.deps import DbPool, RequestLinks
from services.api.network.views import port_view
from shared.context import RequestContext
from shared.db import fixed_ips, project_networks, security_groups

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


async def listed(
    request: Request, collection: str, make: Callable[[], Any]
) -> dict[str, Any] | JSONResponse:
    try:
        return {collection: select(await make(), request)}
    except NeutronError as error:
        return error.response()


def one(items: list[dict[str, Any]], item_id: str, kind: str) -> dict[str, Any] | JSONResponse:
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
        "security_group_rule": "security-group-rules",
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


async def _ports(pool: DbPool, ctx: Context) -> list[dict[str, Any]]:
    async with pool.acquire() as conn:
        held = await fixed_ips.held_addresses(conn, None if ctx.is_admin else ctx.project_id)
        groups = await security_groups.of_instances(
            conn, {address.instance_uuid: address.project_id for address in held}
        )
    return [
        port_view(
            address,
            is_admin=ctx.is_admin,
            groups=[group.id for group in groups.get(address.instance_uuid, [])],
        )
        for address in held
    ]


@router.get("/v2.0/ports", response_model=None)
async def list_ports(request: Request, pool: DbPool, ctx: Context) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        return await _ports(pool, ctx)

    return await listed(request, "ports", make)


@router.get("/v2.0/ports/{port_id}", response_model=None)
async def show_port(port_id: str, pool: DbPool, ctx: Context) -> dict[str, Any] | JSONResponse:
    return one(await _ports(pool, ctx), port_id, "Port")


@router.get("/v2.0/floatingips")
async def list_floating_ips(ctx: Context) -> dict[str, Any]:
    return {"floatingips": []}


@router.get("/v2.0/floatingips/{floating_ip_id}", response_model=None)
async def show_floating_ip(floating_ip_id: str, ctx: Context) -> JSONResponse:
    return NeutronError(
        404, "FloatingIPNotFound", f"Floating IP {floating_ip_id} could not be found"
    ).response()


#: Networking quotas as keel has them: no router, floating IP, subnet pool or RBAC
#: policy can be created (0); networks, subnets and security groups are not limited, and
#: ports (one per server address) are bounded by the compute quotas, not here (-1).
QUOTAS = {
    "network": -1,
    "subnet": -1,
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
        owned = await project_networks.owned_counts(conn, project_id)
    used = {name: 0 for name in QUOTAS} | owned | {"port": ports}
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
