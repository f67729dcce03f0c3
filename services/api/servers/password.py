"""``/servers/{id}/os-server-password``: the encrypted password a guest posted.

In Nova a guest posts its administrator password, encrypted with the server's key pair,
to the metadata service, and users read it here. keel has no metadata service and its
guests post nothing, so the password is always empty (``""``), as Nova answers for a
server whose guest posted none; ``DELETE`` clears it (204) and it stays empty.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool
from services.api.servers.lookup import find_instance

router = APIRouter(prefix="/v2.1/servers")


@router.get("/{server_id}/os-server-password", dependencies=[NO_QUERY_FROM_2_102])
async def show_password(server_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        await find_instance(conn, ctx, server_id)
    return {"password": ""}


@router.delete("/{server_id}/os-server-password", status_code=204, response_class=Response)
async def clear_password(server_id: str, pool: DbPool, ctx: Context) -> Response:
    async with pool.acquire() as conn:
        await find_instance(conn, ctx, server_id)
    return Response(status_code=204)
