"""``/v2.1/images/{id}/metadata``: an image's metadata through the compute API, below
microversion 2.39.

Nova proxied the Image API's custom image properties here until 2.39; keel answers from
its own registry. An image's metadata is its string properties (not its tags, nor its
``protected`` and ``os_hidden`` flags). Anyone who sees the image reads it (``GET``,
``GET /{key}``); its project's members and admins change it: ``POST`` merges keys,
``PUT`` replaces them all, ``PUT /{key}`` sets one (the body's single key must be the
path's) and ``DELETE /{key}`` removes one (204). Someone who sees the image only gets a
403, someone who cannot see it a 404, as if it did not exist. Keys are 1 to 255 of
``a-zA-Z0-9-_:. `` and values strings of up to 255 characters (400 otherwise); the
Image API's own attributes (``name``, ``visibility``...) are not metadata (403, as
Glance refuses them); more keys than the caller's ``metadata_items`` quota is a 403.
Writers of one image take turns (a row lock), so concurrent changes never lose one.
From 2.39 every route is a 404.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import BadRequest, Forbidden, ItemNotFound
from services.api.resources.images import can_change, can_see
from services.api.resources.quota_sets import json_body
from services.api.resources.quotas import project_limits
from shared.context import RequestContext
from shared.db import images as images_db
from shared.exceptions import ImageNotFound
from shared.objects.image import Image

LOG = logging.getLogger(__name__)

#: The compute microversion from which these routes are gone.
GONE = "2.39"


async def gone_from_2_39(version: Version) -> None:
    if version.at_least(GONE):
        raise ItemNotFound(
            f"The compute API has no image metadata routes from microversion {GONE}; use "
            "the Image API (/image/v2/images)."
        )


router = APIRouter(prefix="/v2.1/images", dependencies=[Depends(gone_from_2_39)])

_KEY = re.compile(r"^[a-zA-Z0-9\-_:. ]{1,255}$")
#: The Image API's own attributes: never custom properties.
RESERVED = frozenset(
    {
        "checksum",
        "container_format",
        "created_at",
        "direct_url",
        "disk_format",
        "file",
        "id",
        "locations",
        "min_disk",
        "min_ram",
        "name",
        "os_hash_algo",
        "os_hash_value",
        "os_hidden",
        "owner",
        "protected",
        "schema",
        "self",
        "size",
        "status",
        "tags",
        "updated_at",
        "virtual_size",
        "visibility",
    }
)


def metadata_of(image: Image) -> dict[str, str]:
    return {k: v for k, v in image.properties.items() if isinstance(v, str)}


def parse_metadata(body: object, wrapper: str) -> dict[str, str]:
    """``{wrapper: {KEY: VALUE, ...}}`` checked as Nova's schema does; 400 otherwise."""
    if not isinstance(body, dict) or set(body) != {wrapper}:
        raise BadRequest(f'The request body must be {{"{wrapper}": {{KEY: VALUE, ...}}}}.')
    given = body[wrapper]
    if not isinstance(given, dict):
        raise BadRequest(f"Invalid input for field/attribute {wrapper}: it must be an object.")
    for key, value in given.items():
        if not _KEY.match(key):
            raise BadRequest(
                f"Invalid metadata key {key!r}: 1 to 255 letters, digits, spaces, '-', '_', "
                "':' and '.'."
            )
        if not isinstance(value, str) or len(value) > 255:
            raise BadRequest(
                f"Invalid metadata value for {key!r}: a string of at most 255 characters."
            )
    reserved = sorted(set(given) & RESERVED)
    if reserved:
        raise Forbidden(f"Attribute '{reserved[0]}' is reserved: it is not image metadata.")
    return dict(given)


def _not_found() -> ItemNotFound:
    return ItemNotFound("Image not found.")


async def _read(pool: DbPool, ctx: RequestContext, image_id: str) -> Image:
    try:
        async with pool.acquire() as conn:
            image = await images_db.get(conn, UUID(image_id))
    except (ValueError, ImageNotFound):
        raise _not_found() from None
    if not can_see(ctx, image):
        raise _not_found()
    return image


async def _change(
    pool: DbPool,
    ctx: RequestContext,
    settings: AppSettings,
    image_id: str,
    new_metadata: Callable[[dict[str, str]], dict[str, str]],
) -> dict[str, str]:
    """Give the image the metadata ``new_metadata(current)`` answers; its new metadata."""
    try:
        wanted = UUID(image_id)
    except ValueError:
        raise _not_found() from None
    async with pool.acquire() as conn, conn.transaction():
        try:
            image = await images_db.get_for_update(conn, wanted)
        except ImageNotFound:
            raise _not_found() from None
        if not can_see(ctx, image):
            raise _not_found()
        if not can_change(ctx, image):
            raise Forbidden(f"You are not permitted to modify image {image_id}.")
        metadata = new_metadata(metadata_of(image))
        limit = (await project_limits(conn, ctx.project_id or "", settings.quota))["metadata_items"]
        if limit != -1 and len(metadata) > limit:
            raise Forbidden(f"Image metadata limit exceeded: at most {limit} items.")
        others = {k: v for k, v in image.properties.items() if not isinstance(v, str)}
        await images_db.set_properties(conn, wanted, {**others, **metadata})
    LOG.info("metadata of image %s set by user %s: %s", wanted, ctx.user_id, sorted(metadata))
    return metadata


@router.get("/{image_id}/metadata")
async def show_metadata(image_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    return {"metadata": metadata_of(await _read(pool, ctx, image_id))}


@router.post("/{image_id}/metadata")
async def update_metadata(
    image_id: str, request: Request, pool: DbPool, ctx: Context, settings: AppSettings
) -> dict[str, Any]:
    given = parse_metadata(await json_body(request), "metadata")
    merged = await _change(pool, ctx, settings, image_id, lambda current: {**current, **given})
    return {"metadata": merged}


@router.put("/{image_id}/metadata")
async def replace_metadata(
    image_id: str, request: Request, pool: DbPool, ctx: Context, settings: AppSettings
) -> dict[str, Any]:
    given = parse_metadata(await json_body(request), "metadata")
    return {"metadata": await _change(pool, ctx, settings, image_id, lambda _: given)}


@router.get("/{image_id}/metadata/{key}")
async def show_metadata_item(image_id: str, key: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    metadata = metadata_of(await _read(pool, ctx, image_id))
    if key not in metadata:
        raise ItemNotFound(f"Image {image_id} has no metadata item {key!r}.")
    return {"meta": {key: metadata[key]}}


@router.put("/{image_id}/metadata/{key}")
async def set_metadata_item(
    image_id: str,
    key: str,
    request: Request,
    *,
    pool: DbPool,
    ctx: Context,
    settings: AppSettings,
) -> dict[str, Any]:
    given = parse_metadata(await json_body(request), "meta")
    if len(given) != 1:
        raise BadRequest("The request body must name exactly one metadata item.")
    if key not in given:
        raise BadRequest("Request body and URI mismatch")
    await _change(pool, ctx, settings, image_id, lambda current: {**current, **given})
    return {"meta": given}


@router.delete("/{image_id}/metadata/{key}", status_code=204, response_class=Response)
async def delete_metadata_item(
    image_id: str, key: str, pool: DbPool, ctx: Context, settings: AppSettings
) -> Response:
    def without(current: dict[str, str]) -> dict[str, str]:
        if key not in current:
            raise ItemNotFound("Invalid metadata key")
        return {k: v for k, v in current.items() if k != key}

    await _change(pool, ctx, settings, image_id, without)
    return Response(status_code=204)
