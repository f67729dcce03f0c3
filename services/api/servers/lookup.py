"""What the server routes share: finding the caller's server, its view, its host.

Every router under :mod:`services.api.servers` (and the resources that show servers)
finds a server through :func:`find_instance`, so "not found" and "another project's"
answer alike, and builds views through :func:`server_view`.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import asyncpg

from services.api.http.faults import ItemNotFound
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.servers.forwards import with_forwards
from services.api.servers.views import ServerView
from shared.context import RequestContext
from shared.db import (
    compute_nodes,
    fixed_ips,
    instances,
    placement,
    request_specs,
    security_groups,
    server_groups,
)
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance
from shared.objects.service import Service


def last_segment(ref: str) -> str:
    """``http://host/flavors/3`` → ``3``; a bare id is returned as it is."""
    return ref.rstrip("/").rsplit("/", 1)[-1]


async def find_instance(conn: Connection, ctx: RequestContext, server_id: str) -> Instance:
    """The caller's server ``server_id``; 404 if it does not exist or is another project's."""
    not_found = ItemNotFound(f"Instance {server_id} could not be found.")
    try:
        instance = await instances.get(conn, UUID(server_id))
    except (ValueError, InstanceNotFound):
        raise not_found from None
    if not ctx.is_admin and instance.project_id != ctx.project_id:
        raise not_found
    return instance


async def host_service(pool: asyncpg.Pool, instance: Instance, down_time: float) -> Service | None:
    """The compute service of the instance's node (by id), or ``None`` if it is gone."""
    async with pool.acquire() as conn:
        host = await placement.host_of(conn, instance, down_time)
    return None if host is None else host.service


async def zone_of(conn: Connection, instance: Instance, down_time: float) -> str:
    """The zone the server is in, as its view shows it: its node's once placed, before
    that the one its create asked for (``""`` for none)."""
    states = await compute_nodes.host_states_on(
        conn, down_time, [instance.host] if instance.host else []
    )
    for state in states:
        placed_here = (state.node.host, state.node.hypervisor_hostname) == (
            instance.host,
            instance.node,
        )
        if placed_here and state.node.availability_zone is not None:
            return state.node.availability_zone
    return instance.availability_zone or ""


def host_status(service: Service) -> str:
    if service.forced_down:
        return "DOWN"
    if service.disabled:
        return "MAINTENANCE"
    return "UP" if service.is_up else "UNKNOWN"


async def server_view(
    conn: Connection,
    ctx: RequestContext,
    version: APIVersion,
    links: Links,
    down_time: float,
    *,
    shown: Sequence[Instance],
    forward_name: str | None = None,
) -> ServerView:
    """The view of ``shown`` for this caller: their addresses and zones; for admins
    from 2.16, each host's status. Reads only the hosts of the servers shown."""
    hosts = sorted({instance.host for instance in shown if instance.host})
    states = await compute_nodes.host_states_on(conn, down_time, hosts)
    statuses: dict[str, str] = {}
    if ctx.is_admin and version.at_least("2.16"):
        statuses = {state.service.host: host_status(state.service) for state in states}
    return ServerView(
        version=version,
        links=links,
        is_admin=ctx.is_admin,
        host_statuses=statuses,
        node_zones={
            (s.node.host, s.node.hypervisor_hostname): s.node.availability_zone for s in states
        },
        security_groups={
            uuid: [group.name for group in found]
            for uuid, found in (
                await security_groups.of_instances(
                    conn, {instance.uuid: instance.project_id for instance in shown}
                )
            ).items()
        },
        addresses=with_forwards(
            await fixed_ips.for_instances(conn, [instance.uuid for instance in shown]),
            forward_name,
        ),
        groups=(
            await server_groups.of_instances(conn, [instance.uuid for instance in shown])
            if version.at_least("2.71") and len(shown) == 1
            else {}
        ),
        asked=(
            await request_specs.asked(conn, [instance.uuid for instance in shown])
            if version.at_least("2.96")
            else {}
        ),
    )
