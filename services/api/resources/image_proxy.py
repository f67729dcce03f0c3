"""``/v2.1/images``: the compute API's image routes, below microversion 2.36 only.

Nova proxied the Image API here until 2.36; keel answers from its own image registry in
the proxy's shapes (:mod:`services.api.views.compute_images`): ``GET /images`` and
``/images/detail`` (filters ``name``, ``status``, ``minRam``, ``minDisk``, ``server``,
``type``, ``changes-since``; ``limit``/``marker``; hidden images are left out, as the
Image API leaves them out by default), ``GET /images/{id}``, and
``DELETE /images/{id}`` (204; the image's project or an admin, as keel's Image API
allows; 403 for an image the caller only sees, and for a ``protected`` image). From 2.36 every one
of them is a 404 that points at ``/image/v2/images``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response
from starlette.datastructures import QueryParams

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, RequestLinks
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.paging import next_marker, page_request, take_page
from services.api.http.query import timestamp
from services.api.resources.image_store import remove_data
from services.api.resources.images import can_see, compute_proxy_gone, delete_own
from services.api.servers.lookup import last_segment
from services.api.views.compute_images import image_detail, image_summary, images_page
from shared.context import RequestContext
from shared.db import images as images_db
from shared.exceptions import ImageNotFound
from shared.objects.image import Image

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/images", dependencies=[Depends(compute_proxy_gone)])


def _whole(name: str, value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"Invalid {name} filter [{value}]") from None


def _matches(image: Image, params: QueryParams, since: datetime | None) -> bool:
    """Nova's proxy filters, applied to one image."""
    props = image.properties
    least_ram, least_disk = (
        _whole("minRam", params.get("minRam")),
        _whole("minDisk", params.get("minDisk")),
    )
    checks = (
        params.get("name") in (None, image.name),
        params.get("status") is None or params["status"].lower() == image.status,
        least_ram is None or image.min_ram >= least_ram,
        least_disk is None or image.min_disk >= least_disk,
        params.get("server") is None
        or props.get("instance_uuid") == last_segment(params["server"]),
        params.get("type") is None or props.get("image_type") == params["type"],
        since is None or (image.updated_at or image.created_at) >= since,
    )
    return all(checks)


async def _page(
    request: Request, pool: DbPool, ctx: RequestContext
) -> tuple[list[Image], str | None, int]:
    params = request.query_params
    since = (
        timestamp("changes-since", params["changes-since"]) if "changes-since" in params else None
    )
    paging = page_request(params.get("limit"), params.get("marker"))
    async with pool.acquire() as conn:
        found = await images_db.list_images(conn)
    visible = [
        image
        for image in found
        if can_see(ctx, image)
        and not image.properties.get("os_hidden", False)
        and _matches(image, params, since)
    ]
    page = take_page(visible, paging, key=lambda image: str(image.id))
    return page, next_marker(page, paging, key=lambda image: str(image.id)), paging.limit


@router.get("")
async def list_images(
    request: Request, pool: DbPool, ctx: Context, links: RequestLinks
) -> dict[str, Any]:
    page, after, limit = await _page(request, pool, ctx)
    shown = [image_summary(image, links) for image in page]
    return images_page(shown, links, "images", next_marker=after, limit=limit)


@router.get("/detail")
async def list_images_detail(
    request: Request, pool: DbPool, ctx: Context, links: RequestLinks
) -> dict[str, Any]:
    page, after, limit = await _page(request, pool, ctx)
    shown = [image_detail(image, links) for image in page]
    return images_page(shown, links, "images/detail", next_marker=after, limit=limit)


async def _visible(pool: DbPool, ctx: RequestContext, image_id: str) -> Image:
    try:
        async with pool.acquire() as conn:
            image = await images_db.get(conn, UUID(image_id))
    except (ValueError, ImageNotFound):
        raise ItemNotFound("Image not found.") from None
    if not can_see(ctx, image):
        raise ItemNotFound("Image not found.")
    return image


@router.get("/{image_id}")
async def show_image(
    image_id: str, pool: DbPool, ctx: Context, links: RequestLinks
) -> dict[str, Any]:
    return {"image": image_detail(await _visible(pool, ctx, image_id), links)}


@router.delete("", status_code=204, response_class=Response)
async def delete_no_image(ctx: Context) -> Response:
    """``DELETE /images/`` (a blank id): no such image, as Nova answers it."""
    raise ItemNotFound("Image not found.")


@router.delete("/{image_id}", status_code=204, response_class=Response)
async def delete_image(
    image_id: str, pool: DbPool, ctx: Context, settings: AppSettings
) -> Response:
    try:
        wanted = UUID(image_id)
        await delete_own(pool, ctx, wanted, "You are not allowed to delete the image.")
    except (ValueError, ImageNotFound):
        raise ItemNotFound("Image not found.") from None
    await asyncio.to_thread(remove_data, settings.images.store_dir, wanted)
    LOG.info("image %s deleted through the compute API", wanted)
    return Response(status_code=204)
