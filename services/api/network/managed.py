"""Networks and subnets in the Networking API: the configured network, and the ones
projects create.

``GET`` lists and shows the configured network (shared, external; its subnet from the
settings) beside the project networks the caller may see (their project's; an admin's,
all). ``POST /v2.0/networks`` creates a project network; ``POST /v2.0/subnets`` gives it
its IPv4 subnet (one per network in keel: ``cidr`` from /16 to /30, ``gateway_ip``
the first host unless given or ``null``, one ``allocation_pools`` range at most).
``PUT`` renames either (``name`` only). ``DELETE`` removes either, 409 while a server
holds one of its addresses. The configured network cannot be changed here (403).
"""

from __future__ import annotations

import ipaddress
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool
from services.api.network.routes import NeutronError, listed, one
from services.api.network.views import (
    network_view,
    project_network_view,
    project_subnet_view,
    subnet_id,
    subnet_view,
)
from shared.context import RequestContext
from shared.db import project_networks
from shared.db.pool import Connection
from shared.db.project_networks import NetworkInUse, ProjectNetwork, SubnetRefused
from shared.db.transaction import in_transaction

router = APIRouter(prefix="/network/v2.0")

_NETWORK_KEYS = {
    "name",
    "admin_state_up",
    "shared",
    "description",
    "tenant_id",
    "project_id",
    "router:external",
    "port_security_enabled",
}
_SUBNET_KEYS = {
    "name",
    "network_id",
    "cidr",
    "ip_version",
    "gateway_ip",
    "enable_dhcp",
    "allocation_pools",
    "dns_nameservers",
    "host_routes",
    "description",
    "tenant_id",
    "project_id",
    "subnetpool_id",
}


def bad(message: str) -> NeutronError:
    return NeutronError(400, "HTTPBadRequest", message)


async def body_of(request: Request, kind: str, allowed: set[str]) -> dict[str, Any]:
    """The ``{kind: {...}}`` body's inner object, its keys checked against ``allowed``."""
    try:
        body = await request.json()
    except ValueError:
        raise bad("The request body is not valid JSON.") from None
    if not isinstance(body, dict) or not isinstance(body.get(kind), dict):
        raise bad(f"Resource body required: a JSON object with a '{kind}' object.")
    inner: dict[str, Any] = body[kind]
    unknown = sorted(set(inner) - allowed)
    if unknown:
        raise bad(f"Unrecognized attribute(s) '{', '.join(unknown)}'")
    return inner


def owner(ctx: RequestContext, given: dict[str, Any]) -> str:
    """The project the new resource belongs to: the caller's, or for an admin the one
    named in ``project_id``/``tenant_id``."""
    named = given.get("project_id") or given.get("tenant_id")
    if named is None or named == ctx.project_id:
        return ctx.project_id or ""
    if not isinstance(named, str):
        raise bad("Invalid input for project_id: it must be a string.")
    if not ctx.is_admin:
        raise NeutronError(
            403, "HTTPForbidden", "Only admins may create resources for another project."
        )
    return named


def name_of(given: dict[str, Any]) -> str:
    name = given.get("name", "")
    if not isinstance(name, str) or len(name) > 255:
        raise bad(f"Invalid input for name: {name!r} is not a string of at most 255 characters.")
    return name


def visible(ctx: RequestContext, network: ProjectNetwork | None) -> ProjectNetwork | None:
    if network is None or not (ctx.is_admin or network.project_id == ctx.project_id):
        return None
    return network


async def _networks(pool: DbPool, ctx: RequestContext) -> list[ProjectNetwork]:
    async with pool.acquire() as conn:
        return await project_networks.list_networks(conn, None if ctx.is_admin else ctx.project_id)


@router.get("/networks", response_model=None)
async def list_networks(
    request: Request, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        owned = [project_network_view(n, is_admin=ctx.is_admin) for n in await _networks(pool, ctx)]
        return [network_view(settings.network, is_admin=ctx.is_admin), *owned]

    return await listed(request, "networks", make)


@router.get("/networks/{network_id}", response_model=None)
async def show_network(
    network_id: str, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    shown = [network_view(settings.network, is_admin=ctx.is_admin)]
    shown += [project_network_view(n, is_admin=ctx.is_admin) for n in await _networks(pool, ctx)]
    return one(shown, network_id, "Network")


@router.post("/networks", response_model=None, status_code=201)
async def create_network(
    request: Request, ctx: Context, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    try:
        given = await body_of(request, "network", _NETWORK_KEYS)
        project_id = owner(ctx, given)
        name = name_of(given)
        if given.get("admin_state_up", True) is not True:
            raise bad("keel's networks are always up: admin_state_up must be true.")
        if given.get("shared", False) is not False or given.get("router:external", False):
            raise bad(
                "keel's project networks are the project's own: shared and "
                "router:external must be false."
            )
        if given.get("description", "") not in ("", None):
            raise bad("keel does not keep descriptions of networks: leave description out.")
        if given.get("port_security_enabled", False):
            raise bad("keel filters no traffic: port_security_enabled must be false.")
    except NeutronError as error:
        return error.response()

    async def create(conn: Connection) -> ProjectNetwork:
        return await project_networks.create_network(conn, project_id, name)

    created = await in_transaction(pool, create, what=f"creating network {name!r}")
    return {"network": project_network_view(created, is_admin=ctx.is_admin)}


def _configured(settings: AppSettings, item_id: str, kind: str) -> JSONResponse | None:
    ids = {str(settings.network.network_id), str(subnet_id(settings.network.network_id))}
    if item_id not in ids:
        return None
    return NeutronError(
        403,
        "HTTPForbidden",
        f"{kind} {item_id} is keel's configured network: it is set in keel's settings, "
        "not through this API.",
    ).response()


def _uuid(value: str) -> UUID | None:
    try:
        return UUID(value)
    except ValueError:
        return None


@router.delete("/networks/{network_id}", response_model=None)
async def delete_network(
    network_id: str, ctx: Context, settings: AppSettings, pool: DbPool
) -> Response | JSONResponse:
    if (refused := _configured(settings, network_id, "Network")) is not None:
        return refused
    not_found = NeutronError(404, "NetworkNotFound", f"Network {network_id} could not be found.")
    wanted = _uuid(network_id)
    if wanted is None:
        return not_found.response()

    async def delete(conn: Connection) -> bool:
        if visible(ctx, await project_networks.get_network(conn, wanted)) is None:
            return False
        return await project_networks.delete_network(conn, wanted)

    try:
        deleted = await in_transaction(pool, delete, what=f"deleting network {network_id}")
    except NetworkInUse as exc:
        return NeutronError(409, "NetworkInUse", exc.message).response()
    return Response(status_code=204) if deleted else not_found.response()


@router.get("/subnets", response_model=None)
async def list_subnets(
    request: Request, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    async def make() -> list[dict[str, Any]]:
        owned = [project_subnet_view(n) for n in await _networks(pool, ctx)]
        return [subnet_view(settings.network), *(s for s in owned if s is not None)]

    return await listed(request, "subnets", make)


@router.get("/subnets/{subnet_id}", response_model=None)
async def show_subnet(
    subnet_id: str, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    owned = [project_subnet_view(n) for n in await _networks(pool, ctx)]
    shown = [subnet_view(settings.network), *(s for s in owned if s is not None)]
    return one(shown, subnet_id, "Subnet")


def _address(value: Any, what: str, cidr: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise bad(f"Invalid input for {what}: {value!r} is not a valid IPv4 address.") from None
    if address not in cidr or address in (cidr.network_address, cidr.broadcast_address):
        raise bad(f"Invalid input for {what}: {address} is not a host address of {cidr}.")
    return address


def _cidr(given: dict[str, Any]) -> ipaddress.IPv4Network:
    if given.get("ip_version", 4) != 4:
        raise bad("keel's networks are IPv4 only: ip_version must be 4.")
    raw = given.get("cidr")
    if not isinstance(raw, str):
        raise bad("Invalid input for cidr: a subnet needs its cidr, such as 10.1.0.0/24.")
    try:
        cidr = ipaddress.IPv4Network(raw, strict=False)
    except ValueError:
        raise bad(f"Invalid input for cidr: '{raw}' is not a valid IPv4 subnet.") from None
    if str(cidr) != raw:
        raise bad(
            f"Invalid input for cidr: '{raw}' isn't a recognized IP subnet cidr, "
            f"'{cidr}' is recommended."
        )
    low, high = project_networks.SUBNET_MIN_PREFIX, project_networks.SUBNET_MAX_PREFIX
    if not low <= cidr.prefixlen <= high:
        raise bad(
            f"Invalid input for cidr: keel's subnets are /{low} to /{high}, not /{cidr.prefixlen}."
        )
    return cidr


def subnet_request(
    given: dict[str, Any],
) -> tuple[
    ipaddress.IPv4Network,
    ipaddress.IPv4Address | None,
    ipaddress.IPv4Address,
    ipaddress.IPv4Address,
]:
    """The subnet asked for: its cidr, gateway and first and last allocated address."""
    cidr = _cidr(given)
    for name in ("dns_nameservers", "host_routes"):
        if given.get(name) not in (None, []):
            raise bad(f"keel's subnets have no {name}: leave it out or empty.")
    if given.get("enable_dhcp", True) is not True:
        raise bad("keel's subnets always offer DHCP: enable_dhcp must be true.")
    if given.get("subnetpool_id") is not None:
        raise bad("keel has no subnet pools: give the subnet's cidr.")
    if given.get("description", "") not in ("", None):
        raise bad("keel does not keep descriptions of subnets: leave description out.")
    if "gateway_ip" in given and given["gateway_ip"] is None:
        gateway = None
    else:
        gateway = _address(
            given.get("gateway_ip", str(cidr.network_address + 1)), "gateway_ip", cidr
        )
    pools = given.get("allocation_pools")
    pool = None
    if pools:
        if not isinstance(pools, list) or len(pools) != 1 or not isinstance(pools[0], dict):
            raise bad('keel gives a subnet one allocation pool: [{"start", "end"}].')
        start = _address(pools[0].get("start"), "allocation_pools", cidr)
        end = _address(pools[0].get("end"), "allocation_pools", cidr)
        if end < start:
            raise bad(f"Invalid allocation pool {start} - {end}: its end is before its start.")
        if gateway is not None and start <= gateway <= end:
            raise bad(f"Gateway ip {gateway} conflicts with allocation pool {start} - {end}.")
        pool = (start, end)
    first, last = project_networks.subnet_range(cidr, gateway, pool)
    if last < first or (gateway is not None and first == last == gateway):
        raise bad(f"Subnet {cidr} has no address left for servers.")
    return cidr, gateway, first, last


@router.post("/subnets", response_model=None, status_code=201)
async def create_subnet(
    request: Request, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    try:
        given = await body_of(request, "subnet", _SUBNET_KEYS)
        network_id = given.get("network_id")
        if not isinstance(network_id, str):
            raise bad("Invalid input for network_id: a subnet needs its network's id.")
        if (refused := _configured(settings, network_id, "Network")) is not None:
            return refused
        name = name_of(given)
        cidr, gateway, first, last = subnet_request(given)
    except NeutronError as error:
        return error.response()
    not_found = NeutronError(404, "NetworkNotFound", f"Network {network_id} could not be found.")
    wanted = _uuid(network_id)
    if wanted is None:
        return not_found.response()

    async def create(conn: Connection) -> ProjectNetwork | None:
        network = visible(ctx, await project_networks.get_network(conn, wanted))
        if network is None:
            return None
        if owner(ctx, given) != network.project_id:
            raise bad("A subnet belongs to its network's project.")
        return await project_networks.create_subnet(
            conn, wanted, name=name, cidr=cidr, gateway=gateway, first=first, last=last
        )

    try:
        created = await in_transaction(pool, create, what=f"creating a subnet on {network_id}")
    except NeutronError as error:
        return error.response()
    except SubnetRefused as exc:
        return bad(exc.message).response()
    if created is None:
        return not_found.response()
    return {"subnet": project_subnet_view(created)}


@router.delete("/subnets/{subnet_id}", response_model=None)
async def delete_subnet(
    subnet_id: str, ctx: Context, settings: AppSettings, pool: DbPool
) -> Response | JSONResponse:
    if (refused := _configured(settings, subnet_id, "Subnet")) is not None:
        return refused
    not_found = NeutronError(404, "SubnetNotFound", f"Subnet {subnet_id} could not be found.")
    wanted = _uuid(subnet_id)
    if wanted is None:
        return not_found.response()

    async def delete(conn: Connection) -> bool:
        if visible(ctx, await project_networks.network_of_subnet(conn, wanted)) is None:
            return False
        return await project_networks.delete_subnet(conn, wanted)

    try:
        deleted = await in_transaction(pool, delete, what=f"deleting subnet {subnet_id}")
    except NetworkInUse as exc:
        return NeutronError(409, "SubnetInUse", exc.message).response()
    return Response(status_code=204) if deleted else not_found.response()


async def _rename(
    request: Request, ctx: RequestContext, pool: DbPool, kind: str, item_id: str
) -> ProjectNetwork | JSONResponse:
    """``PUT`` of a network or subnet: only its ``name`` changes."""
    error = "NetworkNotFound" if kind == "network" else "SubnetNotFound"
    label = "Network" if kind == "network" else "Subnet"
    not_found = NeutronError(404, error, f"{label} {item_id} could not be found.")
    try:
        given = await body_of(request, kind, {"name"})
        name = name_of(given) if "name" in given else None
    except NeutronError as refused:
        return refused.response()
    wanted = _uuid(item_id)
    if wanted is None:
        return not_found.response()

    async def change(conn: Connection) -> ProjectNetwork | None:
        if kind == "network":
            found = await project_networks.get_network(conn, wanted)
        else:
            found = await project_networks.network_of_subnet(conn, wanted)
        if visible(ctx, found) is None:
            return None
        assert found is not None
        return await project_networks.rename(
            conn,
            found.id,
            name=name if kind == "network" else None,
            subnet_name=name if kind == "subnet" else None,
        )

    changed = await in_transaction(pool, change, what=f"renaming {kind} {item_id}")
    return not_found.response() if changed is None else changed


@router.put("/networks/{network_id}", response_model=None)
async def update_network(
    network_id: str, request: Request, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    if (refused := _configured(settings, network_id, "Network")) is not None:
        return refused
    changed = await _rename(request, ctx, pool, "network", network_id)
    if isinstance(changed, JSONResponse):
        return changed
    return {"network": project_network_view(changed, is_admin=ctx.is_admin)}


@router.put("/subnets/{subnet_id}", response_model=None)
async def update_subnet(
    subnet_id: str, request: Request, ctx: Context, settings: AppSettings, pool: DbPool
) -> dict[str, Any] | JSONResponse:
    if (refused := _configured(settings, subnet_id, "Subnet")) is not None:
        return refused
    changed = await _rename(request, ctx, pool, "subnet", subnet_id)
    if isinstance(changed, JSONResponse):
        return changed
    return {"subnet": project_subnet_view(changed)}
