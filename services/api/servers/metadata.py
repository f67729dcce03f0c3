"""A server's metadata: ``/servers/{id}/metadata`` and ``/servers/{id}/metadata/{key}``.

As in Nova: ``GET`` reads; ``POST`` adds or changes the given items and ``PUT`` replaces
them all (both answer the whole metadata); ``PUT .../{key}`` sets one item, named both
in the path and in the body; ``DELETE .../{key}`` removes it. Keys are 1 to 255 of
``[A-Za-z0-9_:. -]``, values strings of at most 255 characters. Changes need the
server to be active or stopped with no task running (409 otherwise), and are made in
one statement, so concurrent changes never lose one another. A change that would leave
more items than the project's ``metadata_items`` quota is refused with 403 and undone.
A server deleted meanwhile is a 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.resources.quotas import check_metadata_items, project_limits
from services.api.servers.fields import Metadata
from services.api.servers.locks import check_unlocked
from services.api.servers.lookup import find_instance
from shared.config import QuotaSettings
from shared.context import RequestContext
from shared.db import server_fields
from shared.db.pool import Connection
from shared.objects.instance import Instance
from shared.objects.states import VmState

router = APIRouter(prefix="/v2.1/servers")

#: The vm states in which Nova lets metadata change (keel has no paused or suspended).
CHANGEABLE = (VmState.ACTIVE.value, VmState.STOPPED.value)


class MetadataBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata: Metadata


class MetaBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    meta: Metadata


def not_found_item() -> ItemNotFound:
    return ItemNotFound("Metadata item was not found")


@router.get("/{server_id}/metadata", dependencies=[NO_QUERY_FROM_2_102])
async def show_metadata(server_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    return {"metadata": dict(instance.metadata)}


async def _change(
    pool: asyncpg.Pool,
    ctx: RequestContext,
    server_id: str,
    quota: QuotaSettings,
    change: Callable[[Connection, UUID], Awaitable[Instance]],
) -> Instance:
    """Apply ``change`` in a transaction; 403 if the result exceeds the metadata quota."""
    async with pool.acquire() as conn, conn.transaction():
        instance = await find_instance(conn, ctx, server_id)
        check_unlocked(ctx, instance)
        changed = await change(conn, instance.uuid)
        limits = await project_limits(conn, instance.project_id, quota)
        check_metadata_items(limits, len(changed.metadata))
    return changed


@router.post("/{server_id}/metadata")
async def update_metadata(
    server_id: str, body: MetadataBody, pool: DbPool, ctx: Context, settings: AppSettings
) -> dict[str, Any]:
    """Add or change the given items; the others stay."""

    async def merge(conn: Connection, instance_uuid: UUID) -> Instance:
        return await server_fields.merge_metadata(
            conn, instance_uuid, body.metadata, states=CHANGEABLE
        )

    changed = await _change(pool, ctx, server_id, settings.quota, merge)
    return {"metadata": dict(changed.metadata)}


@router.put("/{server_id}/metadata")
async def replace_metadata(
    server_id: str, body: MetadataBody, pool: DbPool, ctx: Context, settings: AppSettings
) -> dict[str, Any]:
    async def replace(conn: Connection, instance_uuid: UUID) -> Instance:
        return await server_fields.replace_metadata(
            conn, instance_uuid, body.metadata, states=CHANGEABLE
        )

    changed = await _change(pool, ctx, server_id, settings.quota, replace)
    return {"metadata": dict(changed.metadata)}


@router.get("/{server_id}/metadata/{key}", dependencies=[NO_QUERY_FROM_2_102])
async def show_metadata_item(
    server_id: str, key: str, pool: DbPool, ctx: Context
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    if key not in instance.metadata:
        raise not_found_item()
    return {"meta": {key: instance.metadata[key]}}


@router.put("/{server_id}/metadata/{key}")
async def set_metadata_item(
    server_id: str,
    key: str,
    body: MetaBody,
    *,
    pool: DbPool,
    ctx: Context,
    settings: AppSettings,
) -> dict[str, Any]:
    if key not in body.meta:
        raise BadRequest("Request body and URI mismatch")
    if len(body.meta) > 1:
        raise BadRequest("Request body contains too many items")

    async def merge(conn: Connection, instance_uuid: UUID) -> Instance:
        return await server_fields.merge_metadata(conn, instance_uuid, body.meta, states=CHANGEABLE)

    await _change(pool, ctx, server_id, settings.quota, merge)
    return {"meta": dict(body.meta)}


@router.delete("/{server_id}/metadata/{key}", status_code=204, response_class=Response)
async def delete_metadata_item(server_id: str, key: str, pool: DbPool, ctx: Context) -> Response:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        check_unlocked(ctx, instance)
        if key not in instance.metadata:
            raise not_found_item()
        deleted = await server_fields.delete_metadata_item(
            conn, instance.uuid, key, states=CHANGEABLE
        )
    if not deleted:
        raise not_found_item()
    return Response(status_code=204)
