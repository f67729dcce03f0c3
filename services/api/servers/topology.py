"""``GET /servers/{id}/topology`` (microversion 2.78): a server's NUMA topology.

keel's guests are never given a NUMA topology (no ``hw:numa_*`` placement, no CPU
pinning, no huge pages), so every server answers as Nova answers for a server without
one: no NUMA nodes and no page size. Below 2.78 the route does not exist (404), as in
Nova.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, Version
from services.api.http.faults import ItemNotFound
from services.api.servers.lookup import find_instance

router = APIRouter(prefix="/v2.1/servers")

#: The first microversion that has the route.
TOPOLOGY_VERSION = "2.78"


@router.get("/{server_id}/topology", dependencies=[NO_QUERY_FROM_2_102])
async def show_topology(
    server_id: str, pool: DbPool, ctx: Context, version: Version
) -> dict[str, Any]:
    if not version.at_least(TOPOLOGY_VERSION):
        raise ItemNotFound("The resource could not be found.")
    async with pool.acquire() as conn:
        await find_instance(conn, ctx, server_id)
    return {"nodes": [], "pagesize_kb": None}
