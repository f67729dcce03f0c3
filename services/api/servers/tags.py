"""A server's tags (microversion 2.26 and later): ``/servers/{id}/tags[/{tag}]``.

As in Nova: list, replace all (``PUT`` with ``{"tags": [...]}``), remove all, check one
(204 or 404), add one (201, or 204 if it was there) and remove one. A tag is 1 to 60
characters without ``/`` or ``,``; a server has at most 50. Changes need the server to
be active or stopped with no task running (409 otherwise). Below 2.26 these routes do
not exist (404).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.servers.fields import MAX_TAGS, Tag, Tags
from services.api.servers.lookup import find_instance
from services.api.servers.metadata import CHANGEABLE
from shared.db import server_fields

router = APIRouter(prefix="/v2.1/servers")

TAGS_SINCE = "2.26"
_TAG = TypeAdapter(Tag)


class TagsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tags: Tags


def require_tags(version: APIVersion) -> None:
    if not version.at_least(TAGS_SINCE):
        raise ItemNotFound("The resource could not be found.")


def check_tag(tag: str) -> None:
    try:
        _TAG.validate_python(tag)
    except ValidationError as exc:
        raise BadRequest(
            f"Tag '{tag}' is invalid. It must be a non empty string without characters "
            f"'/' and ','. Validation error message: {exc.errors()[0]['msg']}"
        ) from None


def too_many() -> BadRequest:
    return BadRequest(f"The number of tags exceeded the per-server limit {MAX_TAGS}")


def tag_not_found(tag: str) -> ItemNotFound:
    return ItemNotFound(f"Tag '{tag}' could not be found.")


@router.get("/{server_id}/tags", dependencies=[NO_QUERY_FROM_2_102])
async def list_tags(server_id: str, pool: DbPool, ctx: Context, version: Version) -> dict[str, Any]:
    require_tags(version)
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    return {"tags": list(instance.tags)}


@router.put("/{server_id}/tags")
async def replace_tags(
    server_id: str, body: TagsBody, pool: DbPool, ctx: Context, version: Version
) -> dict[str, Any]:
    require_tags(version)
    tags = list(dict.fromkeys(body.tags))
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        changed = await server_fields.replace_tags(conn, instance.uuid, tags, states=CHANGEABLE)
    return {"tags": list(changed.tags)}


@router.delete("/{server_id}/tags", status_code=204, response_class=Response)
async def delete_tags(server_id: str, pool: DbPool, ctx: Context, version: Version) -> Response:
    require_tags(version)
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        await server_fields.replace_tags(conn, instance.uuid, [], states=CHANGEABLE)
    return Response(status_code=204)


@router.get(
    "/{server_id}/tags/{tag}",
    status_code=204,
    response_class=Response,
    dependencies=[NO_QUERY_FROM_2_102],
)
async def check_tag_exists(
    server_id: str, tag: str, pool: DbPool, ctx: Context, version: Version
) -> Response:
    require_tags(version)
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    if tag not in instance.tags:
        raise tag_not_found(tag)
    return Response(status_code=204)


@router.put("/{server_id}/tags/{tag}", response_class=Response)
async def add_tag(
    server_id: str, tag: str, *, pool: DbPool, ctx: Context, version: Version, links: RequestLinks
) -> Response:
    """201 with the tag's location if added, 204 if the server already had it."""
    require_tags(version)
    check_tag(tag)
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        added = await server_fields.add_tag(
            conn, instance.uuid, tag, limit=MAX_TAGS, states=CHANGEABLE
        )
        if added is None:
            current = await find_instance(conn, ctx, server_id)
            if tag not in current.tags:
                raise too_many()
            return Response(status_code=204)
    location = links.compute("servers", str(instance.uuid), "tags", quote(tag, safe=""))
    return Response(status_code=201, headers={"Location": location})


@router.delete("/{server_id}/tags/{tag}", status_code=204, response_class=Response)
async def delete_tag(
    server_id: str, tag: str, pool: DbPool, ctx: Context, version: Version
) -> Response:
    require_tags(version)
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        if not await server_fields.remove_tag(conn, instance.uuid, tag, states=CHANGEABLE):
            raise tag_not_found(tag)
    return Response(status_code=204)
