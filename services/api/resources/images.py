"""The image registry: image metadata in the Image API v2 shapes (data: :mod:`.image_data`).

Served under ``/image/v2/images``; the compute API's own image routes below 2.36 are
:mod:`services.api.resources.image_proxy`. Members see public
and community images and their own project's; admins see every image. As with Glance's
default policies, anyone registers images (``POST``, created ``queued``: ``active`` once
its data is uploaded, see :mod:`.image_data`) for their own project, ``private``,
``shared`` (the default for members: keel has no image members, so only the owner's
project sees it) or ``community``; only admins register ``public`` images (public
unless they ask otherwise) or images owned by another project. An image's owner (any
member of its project) or an admin changes it (``PATCH``, a JSON patch:
:mod:`.image_patch`) or deletes it; anyone else who can see it gets a 403, and anyone
who cannot a 404, as if it did not exist. A ``protected`` image is deleted by no one
(403) until a ``PATCH`` unprotects it. Lists leave out hidden images
(``os_hidden``) unless asked for them with ``os_hidden=true``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.api.http.auth import Context
from services.api.http.bounds import Int4
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import BadRequest, Forbidden, ItemNotFound
from services.api.http.paging import next_marker, page_request, take_page
from services.api.resources import image_patch
from services.api.resources.image_patch import apply_patch, media_type, parse_patch
from services.api.resources.image_store import remove_data
from services.api.views.images import IMAGES_PATH, image_view, images_body
from shared.context import RequestContext
from shared.db import images as images_db
from shared.exceptions import ImageNotFound, ImageProtected
from shared.objects.image import Image, stored_properties

LOG = logging.getLogger(__name__)

router = APIRouter()

#: The compute microversion from which the image routes under ``/v2.1`` are gone.
PROXY_GONE = "2.36"


async def compute_proxy_gone(version: Version) -> None:
    """404 for the image routes under ``/v2.1`` at microversion 2.36 or later."""
    if version.at_least(PROXY_GONE):
        raise ItemNotFound(
            f"The compute API has no image routes from microversion {PROXY_GONE}; use the "
            "Image API (/image/v2/images)."
        )


VISIBILITIES = ("public", "private", "shared", "community")
_SEEN_BY_ALL = ("public", "community")


def can_see(ctx: RequestContext, image: Image) -> bool:
    return ctx.is_admin or image.visibility in _SEEN_BY_ALL or image.owner == ctx.project_id


def can_change(ctx: RequestContext, image: Image) -> bool:
    """Whether the caller may change or delete the image: its project's, or an admin."""
    return ctx.is_admin or (ctx.project_id is not None and image.owner == ctx.project_id)


def parse_id_filter(value: str | None) -> list[UUID] | None:
    """``id=UUID`` or ``id=in:UUID,UUID``; a malformed id is a 400."""
    if value is None:
        return None
    raw = value.removeprefix("in:").split(",")
    try:
        return [UUID(item.strip()) for item in raw if item.strip()]
    except ValueError:
        raise BadRequest(f"Invalid id filter {value!r}: expected image UUIDs.") from None


def parse_hidden(value: str | None) -> bool:
    """``os_hidden``: false (the default) lists visible images, true only hidden ones."""
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise BadRequest(f"Invalid value for os_hidden: {value!r}; use true or false.")
    return lowered == "true"


def _not_found(image_id: str) -> ItemNotFound:
    return ItemNotFound(f"No image found with ID {image_id}")


Q = Annotated[str | None, Query()]

#: The list's query parameters that are Glance's own, not image properties: any other
#: filters on the image property of its name (``image_type=backup``), as in Glance v2.
#: Those keel does not apply (``owner``, ``tag``, ...) are ignored, as before.
LIST_PARAMETERS = frozenset(
    {
        "name",
        "id",
        "visibility",
        "status",
        "os_hidden",
        "limit",
        "marker",
        "sort",
        "sort_key",
        "sort_dir",
        "owner",
        "member_status",
        "protected",
        "tag",
        "container_format",
        "disk_format",
        "size_min",
        "size_max",
        "created_at",
        "updated_at",
    }
)

#: The ``sort_key`` values keel sorts by (each image field of that name).
SORT_KEYS = ("created_at", "updated_at", "name", "id", "status", "size")


def _sort_value(image: Image, key: str) -> tuple[bool, Any]:
    """A sort value that puts ``None`` first and compares like with like."""
    value = getattr(image, key)
    if isinstance(value, UUID):
        value = str(value)
    return (value is not None, value if value is not None else 0)


def sort_images(found: list[Image], sort_key: str | None, sort_dir: str | None) -> list[Image]:
    """``sort_key`` (one of :data:`SORT_KEYS`) and ``sort_dir`` (``asc``, ``desc``: the
    default, as Glance's); neither: the list's own order. Anything else is a 400."""
    if sort_key is None and sort_dir is None:
        return found
    key = sort_key or "created_at"
    if key not in SORT_KEYS:
        raise BadRequest(f"Invalid sort key: {key}. Sort keys: {', '.join(SORT_KEYS)}.")
    direction = sort_dir or "desc"
    if direction not in ("asc", "desc"):
        raise BadRequest(f"Invalid sort direction: {direction}. Use asc or desc.")
    # The id breaks ties, so that a marker finds the same order again.
    return sorted(
        found,
        key=lambda image: (_sort_value(image, key), str(image.id)),
        reverse=direction == "desc",
    )


def property_filters(request: Request) -> dict[str, str]:
    """The query parameters that filter on image properties (see :data:`LIST_PARAMETERS`)."""
    return {k: v for k, v in request.query_params.items() if k not in LIST_PARAMETERS}


def _has_properties(image: Image, wanted: dict[str, str]) -> bool:
    return all(
        key in image.properties and _property_text(image.properties[key]) == value
        for key, value in wanted.items()
    )


def _property_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@router.get("/images")
async def list_images(
    request: Request,
    pool: DbPool,
    *,
    ctx: Context,
    name: Q = None,
    image_id: Annotated[str | None, Query(alias="id")] = None,
    visibility: Q = None,
    status: Q = None,
    os_hidden: Q = None,
    limit: Q = None,
    marker: Q = None,
    sort_key: Q = None,
    sort_dir: Q = None,
) -> dict[str, Any]:
    """The images the caller sees, filtered by Glance's parameters and any image
    property (``?image_type=backup&instance_uuid=...``), sorted by ``sort_key`` and
    ``sort_dir`` when asked."""
    ids = parse_id_filter(image_id)
    hidden = parse_hidden(os_hidden)
    if visibility is not None and visibility not in (*VISIBILITIES, "all"):
        raise BadRequest(f"Invalid visibility value: {visibility}")
    paging = page_request(limit, marker)
    wanted = property_filters(request)
    async with pool.acquire() as conn:
        found = await images_db.list_images(conn, name=name, ids=ids)
    found = [
        image
        for image in found
        if can_see(ctx, image)
        and (visibility in (None, "all") or image.visibility == visibility)
        and (status is None or image.status == status)
        and bool(image.properties.get("os_hidden", False)) == hidden
        and _has_properties(image, wanted)
    ]
    found = sort_images(found, sort_key, sort_dir)
    page = take_page(found, paging, key=lambda image: str(image.id))
    after = next_marker(page, paging, key=lambda image: str(image.id))
    carried = {k: v for k, v in request.query_params.items() if k not in ("marker", "limit")}
    return images_body(
        page,
        next_marker=after,
        limit=paging.limit if paging.limited else None,
        carried=carried,
    )


@router.get("/images/{image_id}")
async def show_image(image_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    try:
        wanted = UUID(image_id)
    except ValueError:
        raise _not_found(image_id) from None
    try:
        async with pool.acquire() as conn:
            image = await images_db.get(conn, wanted)
    except ImageNotFound:
        raise _not_found(image_id) from None
    if not can_see(ctx, image):
        raise _not_found(image_id)
    return image_view(image)


@router.get("/images/{image_id}/tasks")
async def image_tasks(image_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    """The image's import tasks (Image API 2.12): keel runs none, so always none."""
    await show_image(image_id, pool, ctx)
    return {"tasks": []}


class NewImage(BaseModel):
    """An image registration; extra fields are the image's (string) properties."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"additionalProperties": {"type": "string"}}
    )

    id: UUID | None = None
    name: str = Field(min_length=1, max_length=255)
    #: Unset: ``public`` for admins (keel's registry of shared images), ``shared`` for
    #: members (Glance's default).
    visibility: Literal["public", "private", "shared", "community"] | None = None
    disk_format: str | None = Field(default=None, max_length=255)
    container_format: str | None = Field(default=None, max_length=255)
    min_disk: Int4 = 0
    min_ram: Int4 = 0
    owner: str | None = Field(default=None, max_length=255)
    protected: bool = False
    os_hidden: bool = False
    tags: list[Annotated[str, Field(max_length=255)]] = Field(default_factory=list, max_length=128)

    @model_validator(mode="after")
    def _string_properties(self) -> NewImage:
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, str):
                raise ValueError(f"property {key!r} must be a string")
        return self

    def properties(self) -> dict[str, Any]:
        return stored_properties(
            dict(self.model_extra or {}),
            tags=list(self.tags),
            protected=self.protected,
            os_hidden=self.os_hidden,
        )


def _may_register(ctx: RequestContext, body: NewImage) -> str:
    """The visibility a new image gets; 403 for what only admins may register."""
    if ctx.is_admin:
        return body.visibility or "public"
    if body.visibility == "public":
        raise Forbidden(
            "You are not authorized to complete publicize_image action: only admins "
            "register public images."
        )
    if body.owner is not None and body.owner != ctx.project_id:
        raise Forbidden("You are not permitted to create images owned by another project.")
    return body.visibility or "shared"


@router.post("/images", status_code=201)
async def create_image(
    body: NewImage, pool: DbPool, ctx: Context, response: Response
) -> dict[str, Any]:
    visibility = _may_register(ctx, body)
    async with pool.acquire() as conn:
        image = await images_db.create(
            conn,
            image_id=body.id or uuid.uuid4(),
            name=body.name,
            disk_format=body.disk_format,
            container_format=body.container_format,
            min_disk=body.min_disk,
            min_ram=body.min_ram,
            owner=body.owner or ctx.project_id,
            visibility=visibility,
            properties=body.properties(),
            status="queued",
        )
    LOG.info(
        "image %s registered by user %s for project %s (%s)",
        image.id,
        ctx.user_id,
        image.owner,
        image.visibility,
    )
    response.headers["Location"] = f"{IMAGES_PATH}/{image.id}"
    return image_view(image)


@router.patch("/images/{image_id}", openapi_extra=image_patch.OPENAPI)
async def update_image(
    image_id: str, request: Request, pool: DbPool, ctx: Context
) -> dict[str, Any]:
    """Apply a JSON patch (:mod:`.image_patch`) to an image the caller may change, all of
    it or nothing, with the row locked: concurrent updates take turns and lose nothing."""
    changes = parse_patch(await request.body(), media_type(request.headers.get("content-type")))
    try:
        wanted = UUID(image_id)
    except ValueError:
        raise _not_found(image_id) from None
    async with pool.acquire() as conn, conn.transaction():
        try:
            image = await images_db.get_for_update(conn, wanted)
        except ImageNotFound:
            raise _not_found(image_id) from None
        if not can_see(ctx, image):
            raise _not_found(image_id)
        if not can_change(ctx, image):
            raise Forbidden(f"You are not permitted to modify image {image_id}.")
        changed = apply_patch(ctx, image, changes)
        image = await images_db.update(
            conn,
            wanted,
            name=changed.name,
            visibility=changed.visibility,
            owner=changed.owner,
            min_ram=changed.min_ram,
            min_disk=changed.min_disk,
            disk_format=changed.disk_format,
            container_format=changed.container_format,
            properties=changed.properties(),
        )
    LOG.info(
        "image %s updated by user %s of project %s: %s",
        wanted,
        ctx.user_id,
        ctx.project_id,
        ", ".join(f"{c.op} {c.name}" for c in changes) or "no change",
    )
    return image_view(image)


async def delete_own(pool: DbPool, ctx: RequestContext, wanted: UUID, refusal: str) -> Image:
    """Delete an image the caller may change (its owner's member, or an admin): 404 if
    it cannot see it (or it is gone), 403 with ``refusal`` if it sees it only, 403 with
    the Image API's message if it is ``protected`` (admins included)."""
    async with pool.acquire() as conn, conn.transaction():
        image = await images_db.get_for_update(conn, wanted)
        if not can_see(ctx, image):
            raise ImageNotFound(f"Image {wanted} could not be found.")
        if not can_change(ctx, image):
            raise Forbidden(refusal)
        try:
            await images_db.delete(conn, wanted)
        except ImageProtected as protected:
            raise Forbidden(protected.message) from None
    LOG.info("image %s deleted by user %s of project %s", wanted, ctx.user_id, ctx.project_id)
    return image


@router.delete("/images/{image_id}", status_code=204, response_class=Response)
async def delete_image(
    image_id: str, pool: DbPool, ctx: Context, settings: AppSettings
) -> Response:
    try:
        wanted = UUID(image_id)
        await delete_own(pool, ctx, wanted, f"You are not permitted to delete image {image_id}.")
    except (ValueError, ImageNotFound):
        raise _not_found(image_id) from None
    await asyncio.to_thread(remove_data, settings.images.store_dir, wanted)
    return Response(status_code=204)
