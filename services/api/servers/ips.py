"""``GET /servers/{id}/ips`` and ``/ips/{network}``: a server's addresses by network.

As Nova shows them: ``{"addresses": {network: [{"version", "addr"}, ...]}}`` for all of
them, ``{network: [...]}`` for one; a network the server has no address on is a 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import ItemNotFound
from services.api.servers.forwards import with_forwards
from services.api.servers.lookup import find_instance
from services.api.servers.views import addresses_body
from shared.db import fixed_ips

router = APIRouter(prefix="/v2.1/servers")


async def _addresses(
    pool: DbPool, ctx: Context, server_id: str, forward_name: str | None
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        held = await fixed_ips.for_instance(conn, instance.uuid)
    shown = with_forwards({instance.uuid: held}, forward_name).get(instance.uuid, [])
    return addresses_body(shown, extended=False)


@router.get("/{server_id}/ips", dependencies=[NO_QUERY_FROM_2_102])
async def list_ips(
    server_id: str, pool: DbPool, ctx: Context, settings: AppSettings
) -> dict[str, Any]:
    return {"addresses": await _addresses(pool, ctx, server_id, settings.network.forward_name)}


@router.get("/{server_id}/ips/{network}", dependencies=[NO_QUERY_FROM_2_102])
async def show_ips(
    server_id: str, network: str, pool: DbPool, ctx: Context, settings: AppSettings
) -> dict[str, Any]:
    addresses = await _addresses(pool, ctx, server_id, settings.network.forward_name)
    if network not in addresses:
        raise ItemNotFound("There's no network with this label.")
    return {network: addresses[network]}
