"""os-aggregates (admin): host aggregates. keel has none yet, so the list is empty.

Listed because the client reads it to show which aggregates a hypervisor is in.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import AdminContext

router = APIRouter(prefix="/v2.1/os-aggregates")


@router.get("")
async def list_aggregates(ctx: AdminContext) -> dict[str, Any]:
    return {"aggregates": []}
