"""The boot source a build carries: images with data, signed URLs, kernel and ramdisk."""

from __future__ import annotations

import uuid
from urllib.parse import parse_qs, urlsplit
from uuid import UUID

import asyncpg
import pytest

from services.conductor.boot_images import BootImages
from shared import image_urls
from shared.db import images
from shared.exceptions import BuildFailed

pytestmark = pytest.mark.functional

SECRET = "conductor-and-api-share-this-one"


async def _image(pool: asyncpg.Pool, name: str, *, data: bool = True, **props: str) -> UUID:
    image_id = uuid.uuid4()
    async with pool.acquire() as conn:
        await images.create(conn, image_id=image_id, name=name, properties=dict(props))
        if data:
            began = await images.begin_upload(conn, image_id)
            assert began is not None
            await images.finish_upload(
                conn, image_id, began[0], size=3, checksum="m" * 32, os_hash_value="s" * 128
            )
    return image_id


def _valid(url: str, image_id: UUID) -> bool:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert parts.path == f"{image_urls.DOWNLOAD_PATH}/{image_id}"
    return image_urls.refusal(SECRET, image_id, query["expires"], query["signature"]) is None


async def test_an_image_with_a_kernel_and_ramdisk_carries_three_signed_urls(
    db_pool: asyncpg.Pool,
) -> None:
    kernel = await _image(db_pool, "k")
    ramdisk = await _image(db_pool, "r")
    image = await _image(
        db_pool, "guest", kernel_id=str(kernel), ramdisk_id=str(ramdisk), os_command_line="quiet"
    )
    boot_images = BootImages(secret=SECRET, base_url="http://api:8774/", ttl=60)

    async with db_pool.acquire() as conn:
        boot = await boot_images.source(conn, str(image))

    assert boot is not None
    assert boot.kernel is not None
    assert boot.ramdisk is not None
    assert [f.id for f in (boot.image, boot.kernel, boot.ramdisk)] == [image, kernel, ramdisk]
    assert all(_valid(f.url, f.id) for f in (boot.image, boot.kernel, boot.ramdisk))
    assert boot.image.url.startswith("http://api:8774/image/download/")
    assert (boot.image.os_hash_algo, boot.image.checksum) == ("sha512", "m" * 32)
    assert boot.kernel_args == "quiet"


async def test_no_boot_source_without_a_secret_or_without_data(db_pool: asyncpg.Pool) -> None:
    with_data = await _image(db_pool, "full")
    without = await _image(db_pool, "empty", data=False)

    async with db_pool.acquire() as conn:
        unsigned = await BootImages(None, "http://api", 60).source(conn, str(with_data))
        empty = await BootImages(SECRET, "http://api", 60).source(conn, str(without))
        unknown = await BootImages(SECRET, "http://api", 60).source(conn, str(uuid.uuid4()))

    assert (unsigned, empty, unknown) == (None, None, None)


async def test_a_kernel_that_is_missing_or_empty_fails_the_build(db_pool: asyncpg.Pool) -> None:
    empty_kernel = await _image(db_pool, "k", data=False)
    image = await _image(db_pool, "guest", kernel_id=str(empty_kernel))
    orphan = await _image(db_pool, "orphan", kernel_id=str(uuid.uuid4()))
    boot_images = BootImages(SECRET, "http://api", 60)

    async with db_pool.acquire() as conn:
        with pytest.raises(BuildFailed, match="which has no data"):
            await boot_images.source(conn, str(image))
        with pytest.raises(BuildFailed, match="which does not exist"):
            await boot_images.source(conn, str(orphan))
