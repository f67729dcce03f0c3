"""Image data: ``PUT`` / ``GET /image/v2/images/{id}/file``, and signed downloads.

Uploads and downloads stream: a chunk at a time between the client and a file in
``KEEL_IMAGES__STORE_DIR`` (never a whole image in memory). An upload computes the
data's MD5 (``checksum``) and SHA-512 (``os_hash_algo``/``os_hash_value``) as it goes and
is kept only once whole; as in Glance:

* ``PUT`` (the image's owner, or an admin) takes an image without data — ``queued``, or
  registered ``active`` without data — to ``saving`` (a compare-and-swap: a second upload
  at the same time is a 409), then to ``active`` with its size and hashes. An image that
  has data, or is being uploaded, is a 409; a body larger than
  ``KEEL_IMAGES__MAX_SIZE_BYTES`` a 413, at once when ``Content-Length`` says so. A failed
  or cut upload gives the image back as it was and leaves no file;
* ``GET`` answers 200 with the data, ``Content-Length`` and ``Content-MD5`` (the hex MD5,
  which clients compare), or 204 for an image without data;
* ``GET /image/download/{id}?expires=..&signature=..`` is how agents fetch data without
  API credentials (:mod:`shared.image_urls`): an expired or forged URL is a 403, logged
  with the reason;
* ``PUT /image/upload/{id}?expires=..&signature=..`` is how an agent writes a server
  snapshot's data (:func:`signed_upload`), under the same rules as a ``PUT`` of a user.

A server backup's image (``createBackup``) rotates its server's backups in the same
transaction that makes it ``active`` (:func:`shared.db.backups.rotate`); the data of the
backups it deletes is removed after, as an image delete removes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, BinaryIO
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import (
    ConflictingRequest,
    Fault,
    Forbidden,
    ItemNotFound,
    ServiceUnavailable,
)
from services.api.resources.image_store import UPLOAD_PREFIX, data_path, remove_data
from services.api.resources.images import can_see
from shared import image_urls
from shared.config import Settings
from shared.db import backups, snapshots
from shared.db import images as images_db
from shared.exceptions import ImageNotFound
from shared.objects.image import Image
from shared.objects.states import TaskState

LOG = logging.getLogger(__name__)

router = APIRouter()
download_router = APIRouter()

CHUNK = 1024 * 1024
#: Seconds between two touches of an upload in progress.
TOUCH_EVERY = 30.0


class PayloadTooLarge(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(413, message)


async def _image(pool: asyncpg.Pool, image_id: str) -> Image:
    try:
        wanted = UUID(image_id)
        async with pool.acquire() as conn:
            return await images_db.get(conn, wanted)
    except (ValueError, ImageNotFound):
        raise ItemNotFound(f"No image found with ID {image_id}") from None


@router.put("/images/{image_id}/file", status_code=204, response_class=Response)
async def upload(
    image_id: str, request: Request, pool: DbPool, ctx: Context, settings: AppSettings
) -> Response:
    image = await _image(pool, image_id)
    if not can_see(ctx, image):
        raise ItemNotFound(f"No image found with ID {image_id}")
    if not (ctx.is_admin or image.owner == ctx.project_id):
        raise Forbidden(f"You are not permitted to upload data for image {image_id}.")
    _check_declared(request, settings.images.max_size_bytes)
    async with pool.acquire() as conn:
        began = await images_db.begin_upload(conn, image.id)
    if began is None:
        raise ConflictingRequest(
            f"Image {image_id} has data already or is being uploaded (status "
            f"{image.status}); data can only be uploaded to an image without any."
        )
    await _store(request, pool, settings, image, began)
    return Response(status_code=204)


async def _store(
    request: Request,
    pool: asyncpg.Pool,
    settings: Settings,
    image: Image,
    began: tuple[UUID, str],
    *,
    started: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Stream the body into the store as the image's data, the upload ``began`` holds;
    ``started`` is awaited once the first bytes arrive."""
    token, before = began
    limit = settings.images.max_size_bytes
    store = settings.images.store_dir
    await asyncio.to_thread(store.mkdir, parents=True, exist_ok=True)
    scratch = store / f"{UPLOAD_PREFIX}{image.id}-{secrets.token_hex(4)}"
    md5: str | None = None
    try:
        size, md5, sha512 = await _receive(
            request, scratch, limit, pool=pool, image_id=image.id, token=token, started=started
        )
        await asyncio.to_thread(scratch.replace, data_path(store, image.id))
        async with pool.acquire() as conn, conn.transaction():
            done = await images_db.finish_upload(
                conn, image.id, token, size=size, checksum=md5, os_hash_value=sha512
            )
            rotated = [] if done is None else await backups.rotate(conn, image.id)
    except BaseException as exc:
        if md5 is not None and await _finished(pool, image.id, md5):
            # The commit took effect and only its answer was lost: the image is whole.
            LOG.warning(
                "image %s has its data, but the answer to its upload was lost (%s)",
                image.id,
                exc,
            )
            raise
        await _abandon(pool, image.id, token, before, (scratch, data_path(store, image.id)))
        LOG.info("upload of image %s stopped (%s)", image.id, exc)
        raise
    if done is None:
        await asyncio.to_thread(data_path(store, image.id).unlink, missing_ok=True)
        raise ConflictingRequest(f"Image {image.id} was deleted while its data was uploaded.")
    LOG.info("image %s has data: %d bytes, md5 %s", image.id, size, md5)
    for deleted in rotated:
        await asyncio.to_thread(remove_data, store, deleted)
    if rotated:
        LOG.info(
            "backup %s is whole: rotated out (deleted) backup(s) %s",
            image.id,
            ", ".join(map(str, rotated)),
            extra={"decision": "backups_rotated"},
        )


def _check_declared(request: Request, limit: int) -> None:
    """413 at once when ``Content-Length`` says the body is larger than ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"Image exceeds the storage quota: {declared} > {limit} bytes.")


async def _finished(pool: asyncpg.Pool, image_id: UUID, md5: str) -> bool:
    """Whether an upload whose end failed made the image whole after all (a commit whose
    answer was lost): then its data is the image's, and must stay."""
    try:
        async with pool.acquire() as conn:
            image = await images_db.get(conn, image_id)
    except Exception:  # unknown: the upload is given back as failed
        return False
    return image.status == "active" and image.checksum == md5


async def _abandon(
    pool: asyncpg.Pool, image_id: UUID, token: UUID, before: str, files: tuple[Path, ...]
) -> None:
    """Give a failed upload's image back as it was, without its partial data."""
    for path in files:
        await asyncio.to_thread(path.unlink, missing_ok=True)
    try:
        async with pool.acquire() as conn:
            await images_db.abandon_upload(conn, image_id, token, before)
    except Exception as exc:
        LOG.warning(
            "image %s stays 'saving' after a failed upload (%s); a new upload may take it "
            "over after %d seconds",
            image_id,
            exc,
            images_db.STALE_UPLOAD_SECONDS,
        )
    else:
        LOG.info("image %s is %s again, without data", image_id, before)


async def _receive(
    request: Request,
    scratch: Path,
    limit: int,
    *,
    pool: asyncpg.Pool,
    image_id: UUID,
    token: UUID,
    started: Callable[[], Awaitable[None]] | None = None,
) -> tuple[int, str, str]:
    """Stream the body into ``scratch``; its size, MD5 and SHA-512."""
    md5, sha512 = hashlib.md5(usedforsecurity=False), hashlib.sha512()
    size, pending, touched = 0, bytearray(), time.monotonic()
    out = await asyncio.to_thread(scratch.open, "xb")
    try:
        async for chunk in request.stream():
            if started is not None and chunk:
                await started()
                started = None
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"Image exceeds the storage quota of {limit} bytes.")
            pending += chunk
            if len(pending) >= CHUNK:
                # Hashing and writing a block happen off the event loop: a large upload
                # must not stall every other request keel-api serves.
                await asyncio.to_thread(_take, bytes(pending), out, md5, sha512)
                pending.clear()
            if time.monotonic() - touched > TOUCH_EVERY:
                async with pool.acquire() as conn:
                    if not await images_db.touch_upload(conn, image_id, token):
                        raise ConflictingRequest(f"Image {image_id} was taken by another upload.")
                touched = time.monotonic()
        await asyncio.to_thread(_take, bytes(pending), out, md5, sha512)
        await asyncio.to_thread(out.flush)
        await asyncio.to_thread(os.fsync, out.fileno())
    finally:
        await asyncio.to_thread(out.close)
    return size, md5.hexdigest(), sha512.hexdigest()


def _take(block: bytes, out: BinaryIO, *digests: Any) -> None:
    """Hash a block of an upload and write it (in a thread)."""
    for digest in digests:
        digest.update(block)
    out.write(block)


def _stream(image: Image, store: Path) -> Response:
    """The image's data as a streamed answer; 204 when it has none."""
    if not image.has_data:
        return Response(status_code=204)
    path = data_path(store, image.id)
    try:
        stream = path.open("rb")
    except OSError as exc:
        LOG.error("image %s is active but its data cannot be read: %s", image.id, exc)
        raise ServiceUnavailable(
            f"The data of image {image.id} cannot be read from the image store."
        ) from None

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while chunk := await asyncio.to_thread(stream.read, CHUNK):
                yield chunk
        finally:
            stream.close()

    headers = {"Content-Length": str(image.size), "Content-MD5": image.checksum or ""}
    return StreamingResponse(chunks(), media_type="application/octet-stream", headers=headers)


@router.get("/images/{image_id}/file", response_class=Response)
async def download(image_id: str, pool: DbPool, ctx: Context, settings: AppSettings) -> Response:
    image = await _image(pool, image_id)
    if not can_see(ctx, image):
        raise ItemNotFound(f"No image found with ID {image_id}")
    return _stream(image, settings.images.store_dir)


Q = Annotated[str | None, Query()]


@download_router.get(f"{image_urls.DOWNLOAD_PATH}/{{image_id}}", response_class=Response)
async def signed_download(
    image_id: str,
    request: Request,
    pool: DbPool,
    settings: AppSettings,
    *,
    expires: Q = None,
    signature: Q = None,
) -> Response:
    """An agent's download: no token, a signed URL (see :mod:`shared.image_urls`)."""
    try:
        wanted = UUID(image_id)
    except ValueError:
        raise Forbidden("This download URL is not valid.") from None
    why = image_urls.refusal(settings.images.url_secret, wanted, expires, signature)
    if why is not None:
        client = request.client.host if request.client else "unknown"
        LOG.warning(
            "refused a download of image %s from %s: %s",
            image_id,
            client,
            why,
            extra={"decision": "image_download_refused"},
        )
        raise Forbidden(f"This download URL is not valid: {why}.")
    return _stream(await _image(pool, image_id), settings.images.store_dir)


@download_router.put(
    f"{image_urls.UPLOAD_PATH}/{{image_id}}", status_code=204, response_class=Response
)
async def signed_upload(
    image_id: str,
    request: Request,
    pool: DbPool,
    settings: AppSettings,
    *,
    expires: Q = None,
    signature: Q = None,
) -> Response:
    """An agent's upload of a server snapshot's data: no token, a signed URL (see
    :mod:`shared.image_urls`), for an image that is a snapshot still waiting for its data.

    The server's task follows the upload: ``image_pending_upload`` once it is accepted,
    ``image_uploading`` once its data streams (the agent's result ends the task)."""
    try:
        wanted = UUID(image_id)
    except ValueError:
        raise Forbidden("This upload URL is not valid.") from None
    why = image_urls.refusal(settings.images.url_secret, wanted, expires, signature, upload=True)
    if why is not None:
        client = request.client.host if request.client else "unknown"
        LOG.warning(
            "refused an upload to image %s from %s: %s",
            image_id,
            client,
            why,
            extra={"decision": "image_upload_refused"},
        )
        raise Forbidden(f"This upload URL is not valid: {why}.")
    image = await _image(pool, image_id)
    _check_declared(request, settings.images.max_size_bytes)
    async with pool.acquire() as conn, conn.transaction():
        instance_uuid = await snapshots.snapshot_of(conn, image.id)
        if instance_uuid is None:
            raise Forbidden(f"Image {image_id} is not a server snapshot.")
        began = await images_db.begin_upload(conn, image.id)
        if began is not None:
            await snapshots.advance(conn, instance_uuid, TaskState.IMAGE_PENDING_UPLOAD)
    if began is None:
        raise ConflictingRequest(
            f"Image {image_id} has data already or is being uploaded (status {image.status})."
        )

    async def streaming() -> None:
        async with pool.acquire() as conn:
            await snapshots.advance(conn, instance_uuid, TaskState.IMAGE_UPLOADING)

    await _store(request, pool, settings, image, began, started=streaming)
    return Response(status_code=204)
