"""Identity version discovery, read by the client without a token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.deps import RequestLinks
from services.api.identity import views

router = APIRouter(prefix="/identity")


@router.get("")
@router.get("/")
async def list_versions(links: RequestLinks) -> dict[str, Any]:
    return {"versions": {"values": [views.version(links)]}}


@router.get("/v3")
@router.get("/v3/")
async def show_version(links: RequestLinks) -> dict[str, Any]:
    return {"version": views.version(links)}
