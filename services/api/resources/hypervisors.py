"""os-hypervisors (admin): compute nodes with their capacity, usage and service state.

Ids are integers below microversion 2.53 and node UUIDs from 2.53, where the list can
also be narrowed with ``hypervisor_hostname_pattern`` (a substring of the node name)
and show each node's servers with ``with_servers=true``. Below 2.53 the same is asked
with ``/os-hypervisors/{pattern}/search`` and ``/os-hypervisors/{pattern}/servers``.
``/os-hypervisors/statistics`` sums the nodes of enabled compute services. From 2.88 the
detail shows each host's uptime instead of capacity figures, and ``statistics`` and
``{id}/uptime`` are gone (404).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Depends, Query, Request

from services.api.http.auth import AdminContext
from services.api.http.deps import AppSettings, Compute, DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest, Fault, ItemNotFound, ServiceUnavailable
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.http.paging import marker_not_found, next_marker, page_request
from services.api.http.query import boolean, refuse_unknown
from services.api.views.hypervisors import (
    NO_STATISTICS_VERSION,
    hypervisor_id,
    hypervisor_view,
    statistics_view,
)
from services.api.views.hypervisors import with_servers as add_servers
from services.compute.rpcapi import ComputeAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import compute_nodes, placement
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, MessagingError, ServiceTooOld, Unroutable
from shared.objects.compute_node import HostState
from shared.objects.instance import Instance

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/os-hypervisors")

Q = Annotated[str | None, Query()]


@dataclass(frozen=True)
class HypervisorQuery:
    pattern: str | None
    limit: str | None
    marker: str | None
    with_servers: str | None = None


#: The query parameters of the lists and of a hypervisor shown, from 2.53, where Nova's
#: schemas refuse any other.
LIST_QUERY = frozenset({"hypervisor_hostname_pattern", "limit", "marker", "with_servers"})
SHOW_QUERY = frozenset({"with_servers"})


async def hypervisor_query(
    request: Request,
    version: Version,
    *,
    hypervisor_hostname_pattern: Q = None,
    limit: Q = None,
    marker: Q = None,
    with_servers: Q = None,
) -> HypervisorQuery:
    refuse_unknown(request.query_params, LIST_QUERY, version, since="2.53")
    return HypervisorQuery(hypervisor_hostname_pattern, limit, marker, with_servers)


def wants_servers(query: HypervisorQuery, version: APIVersion) -> bool:
    if query.with_servers is None or not version.at_least("2.53"):
        return False
    return boolean("with_servers", query.with_servers)


async def servers_on(conn: Connection, state: HostState) -> list[Instance]:
    """The live servers on the hypervisor (linked to its node by id)."""
    return await placement.instances_on(conn, state.node)


async def matching(conn: Connection, down_time: float, pattern: str) -> list[HostState]:
    found = await compute_nodes.host_states_matching(conn, down_time, pattern)
    if not found:
        raise ItemNotFound(f"No hypervisor matching '{pattern}' could be found.")
    return found


async def _after(conn: Connection, marker: str | None, version: APIVersion) -> int | None:
    """The node id a marker names (a UUID from 2.53, an integer id before); 400 if none."""
    if marker is None:
        return None
    node_id: int | None = None
    try:
        if version.at_least("2.53"):
            node_id = await compute_nodes.live_id(conn, node_uuid=UUID(marker))
        else:
            node_id = await compute_nodes.live_id(conn, node_id=int(marker))
    except ValueError:
        pass
    if node_id is None:
        raise marker_not_found(marker)
    return node_id


Filters = Annotated[HypervisorQuery, Depends(hypervisor_query)]


async def uptime_of(compute: ComputeAPI, ctx: RequestContext, state: HostState) -> str | None:
    """The host's uptime as its agent reads it, or ``None`` when the agent cannot say
    (its service is down, it is gone, too old, or does not answer), as Nova shows it."""
    if not state.service.is_up:
        return None
    try:
        return await compute.get_host_uptime(ctx, state.service.uuid)
    except (ServiceTooOld, Unroutable, MessagingError) as exc:
        LOG.info("no uptime for hypervisor %s: %s", state.node.uuid, exc)
        return None


async def uptimes(
    compute: ComputeAPI, ctx: RequestContext, states: list[HostState], version: APIVersion
) -> list[str | None]:
    """Each host's uptime for a detail at ``version`` (asked all at once; none below 2.88)."""
    if not version.at_least(NO_STATISTICS_VERSION):
        return [None] * len(states)
    return list(await asyncio.gather(*(uptime_of(compute, ctx, s) for s in states)))


async def _list(
    pool: asyncpg.Pool,
    *,
    settings: Settings,
    version: APIVersion,
    query: HypervisorQuery,
    links: Links,
    path: str,
    detail: bool,
    answer: tuple[ComputeAPI, RequestContext] | None = None,
) -> dict[str, Any]:
    """A page of hypervisors; ``answer``: who asks their agents for uptimes (a detail)."""
    servers = wants_servers(query, version)
    pattern = query.pattern if version.at_least("2.53") else None
    # Paging arrived in 2.33: before it, limit and marker are ignored (as Nova does).
    limit, marker = (query.limit, query.marker) if version.at_least("2.33") else (None, None)
    paging = page_request(limit, marker, max_limit=settings.api.max_limit)
    down_time = settings.service_down_time
    async with pool.acquire() as conn:
        after = await _after(conn, paging.marker, version)
        page = await compute_nodes.host_states_page(
            conn, down_time, after_id=after, limit=paging.limit, pattern=pattern
        )
        if not page and pattern is not None and after is None:
            raise ItemNotFound(f"No hypervisor matching '{pattern}' could be found.")
        on = [await servers_on(conn, s) for s in page] if servers else []
    times = await uptimes(*answer, page, version) if answer and detail else [None] * len(page)
    views = [
        hypervisor_view(s, version, detail=detail, uptime=t)
        for s, t in zip(page, times, strict=True)
    ]
    if servers:
        views = [add_servers(v, held, version) for v, held in zip(views, on, strict=True)]
    body: dict[str, Any] = {"hypervisors": views}

    def key(state: HostState) -> str:
        return str(hypervisor_id(state, version))

    following = next_marker(page, paging, key=key) if paging.limited else None
    if following is not None:
        href = f"{links.compute(path)}?{urlencode({'limit': paging.limit, 'marker': following})}"
        body["hypervisors_links"] = [{"rel": "next", "href": href}]
    return body


@router.get("")
async def list_hypervisors(
    pool: DbPool,
    *,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
    links: RequestLinks,
    query: Filters,
) -> dict[str, Any]:
    return await _list(
        pool,
        settings=settings,
        version=version,
        query=query,
        links=links,
        path="os-hypervisors",
        detail=False,
    )


@router.get("/detail")
async def list_hypervisors_detail(
    pool: DbPool,
    *,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
    links: RequestLinks,
    query: Filters,
    compute: Compute,
) -> dict[str, Any]:
    return await _list(
        pool,
        settings=settings,
        version=version,
        query=query,
        links=links,
        path="os-hypervisors/detail",
        detail=True,
        answer=(compute, ctx),
    )


async def _find(
    pool: asyncpg.Pool, hypervisor: str, version: APIVersion, down_time: float
) -> HostState:
    not_found = ItemNotFound(f"Hypervisor with ID {hypervisor} could not be found.")
    if version.at_least("2.53"):
        try:
            node_uuid = UUID(hypervisor)
        except ValueError:
            raise BadRequest(f"Invalid uuid {hypervisor}") from None
        try:
            async with pool.acquire() as conn:
                return await compute_nodes.host_state(conn, node_uuid, down_time)
        except ComputeNodeNotFound:
            raise not_found from None
    try:
        node_id = int(hypervisor)
    except ValueError:
        raise not_found from None
    try:
        async with pool.acquire() as conn:
            return await compute_nodes.host_state_by_id(conn, node_id, down_time)
    except ComputeNodeNotFound:
        raise not_found from None


def before_2_88(version: APIVersion) -> None:
    """``statistics`` and ``{id}/uptime`` are gone from 2.88 (404), as in Nova."""
    if version.at_least(NO_STATISTICS_VERSION):
        raise ItemNotFound("The resource could not be found.")


@router.get("/statistics")
async def show_statistics(
    pool: DbPool, ctx: AdminContext, version: Version, settings: AppSettings
) -> dict[str, Any]:
    before_2_88(version)
    async with pool.acquire() as conn:
        totals = await compute_nodes.enabled_totals(conn)
    return statistics_view(totals)


def legacy_only(version: APIVersion) -> None:
    """The pattern routes exist below 2.53 only (from 2.53 the list's query does it)."""
    if version.at_least("2.53"):
        raise ItemNotFound("The resource could not be found.")


@router.get("/{pattern}/search")
async def search_hypervisors(
    pattern: str, pool: DbPool, ctx: AdminContext, version: Version, settings: AppSettings
) -> dict[str, Any]:
    legacy_only(version)
    async with pool.acquire() as conn:
        states = await matching(conn, settings.service_down_time, pattern)
    return {"hypervisors": [hypervisor_view(s, version, detail=False) for s in states]}


@router.get("/{pattern}/servers")
async def hypervisor_servers(
    pattern: str, pool: DbPool, ctx: AdminContext, version: Version, settings: AppSettings
) -> dict[str, Any]:
    legacy_only(version)
    async with pool.acquire() as conn:
        states = await matching(conn, settings.service_down_time, pattern)
        views = [
            add_servers(
                hypervisor_view(s, version, detail=False), await servers_on(conn, s), version
            )
            for s in states
        ]
    return {"hypervisors": views}


@router.get("/{hypervisor}")
async def show_hypervisor(
    hypervisor: str,
    request: Request,
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
    compute: Compute,
    with_servers: Q = None,
) -> dict[str, Any]:
    """One hypervisor in detail; from 2.53 with its servers if ``with_servers`` says so."""
    refuse_unknown(request.query_params, SHOW_QUERY, version, since="2.53")
    state = await _find(pool, hypervisor, version, settings.service_down_time)
    [uptime] = await uptimes(compute, ctx, [state], version)
    body = hypervisor_view(state, version, detail=True, uptime=uptime)
    if wants_servers(HypervisorQuery(None, None, None, with_servers), version):
        async with pool.acquire() as conn:
            body = add_servers(body, await servers_on(conn, state), version)
    return {"hypervisor": body}


@router.get("/{hypervisor}/uptime")
async def show_uptime(
    hypervisor: str,
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
    compute: Compute,
) -> dict[str, Any]:
    """The hypervisor's host uptime, as its agent reads it (compute RPC 1.7).

    A host whose agent is down is a 400, as in Nova; an agent too old to tell is 501.
    Gone from 2.88, where the detail shows the uptime.
    """
    before_2_88(version)
    state = await _find(pool, hypervisor, version, settings.service_down_time)
    service = state.service
    if not service.is_up:
        raise BadRequest(f"Compute service of {service.host} is unavailable at this time.")
    try:
        uptime = await compute.get_host_uptime(ctx, service.uuid)
    except ServiceTooOld as exc:
        raise Fault(
            501, f"The agent of {service.host} does not report uptime: {exc.message}"
        ) from None
    except Unroutable:
        raise BadRequest(
            f"Compute service of {service.host} is unavailable at this time."
        ) from None
    except MessagingError as exc:
        raise ServiceUnavailable(
            f"The agent of {service.host} did not answer: {exc.message}"
        ) from None
    return {"hypervisor": {**hypervisor_view(state, version, detail=False), "uptime": uptime}}
