"""Image data through keel-api: uploads, downloads and signed download URLs."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared import image_urls
from shared.config import ImageSettings, Settings
from shared.db import images as images_db
from tests.functional.services.api.conftest import ADMIN, IMAGE_ID, MEMBER, add_image

pytestmark = pytest.mark.functional

SECRET = "a-test-secret-of-32-characters!!"
LIMIT = 4 * 1024 * 1024
DATA = os.urandom(3 * 1024 * 1024 + 17)


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    images = ImageSettings(store_dir=tmp_path / "store", url_secret=SECRET, max_size_bytes=LIMIT)
    return settings.model_copy(update={"images": images})


def _file(image_id: UUID = IMAGE_ID) -> str:
    return f"/image/v2/images/{image_id}/file"


async def _without_data(client: httpx.AsyncClient, name: str = "blank") -> str:
    created = await client.post(
        "/image/v2/images",
        headers=ADMIN,
        json={"name": name, "disk_format": "raw", "container_format": "bare"},
    )
    assert created.status_code == 201, created.text
    image_id: str = created.json()["id"]
    return image_id


async def _chunks(data: bytes, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_upload_then_download_is_byte_identical_with_its_hashes(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    image_id = await _without_data(client)

    put = await client.put(
        f"/image/v2/images/{image_id}/file",
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
        content=_chunks(DATA),
    )
    shown = (await client.get(f"/image/v2/images/{image_id}", headers=MEMBER)).json()
    got = await client.get(f"/image/v2/images/{image_id}/file", headers=MEMBER)

    assert put.status_code == 204, put.text
    assert got.status_code == 200
    assert got.content == DATA
    md5 = hashlib.md5(DATA, usedforsecurity=False).hexdigest()
    assert got.headers["Content-MD5"] == md5
    assert (shown["status"], shown["size"], shown["checksum"]) == ("active", len(DATA), md5)
    assert shown["os_hash_algo"] == "sha512"
    assert shown["os_hash_value"] == hashlib.sha512(DATA).hexdigest()
    assert [p.name for p in settings.images.store_dir.iterdir()] == [image_id]


async def test_twin_uploads_at_once_keep_one_and_refuse_the_other(
    client: httpx.AsyncClient,
) -> None:
    image_id = await _without_data(client)
    other = os.urandom(1024 * 1024)

    answers = await asyncio.gather(
        client.put(_file(UUID(image_id)), headers=ADMIN, content=_chunks(DATA)),
        client.put(_file(UUID(image_id)), headers=ADMIN, content=_chunks(other)),
    )
    again = await client.put(_file(UUID(image_id)), headers=ADMIN, content=b"late")
    got = await client.get(_file(UUID(image_id)), headers=ADMIN)

    assert sorted(a.status_code for a in answers) == [204, 409]
    winner = DATA if answers[0].status_code == 204 else other
    assert got.content == winner
    assert again.status_code == 409
    assert "has data already" in again.json()["conflictingRequest"]["message"]


async def test_too_large_uploads_are_413_and_leave_the_image_as_it_was(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    image_id = await _without_data(client)
    before = (await client.get(f"/image/v2/images/{image_id}", headers=ADMIN)).json()["status"]
    declared = await client.put(_file(UUID(image_id)), headers=ADMIN, content=b"x" * (LIMIT + 1))
    streamed = await client.put(
        _file(UUID(image_id)), headers=ADMIN, content=_chunks(b"x" * (LIMIT + 1))
    )
    shown = (await client.get(f"/image/v2/images/{image_id}", headers=ADMIN)).json()

    assert (declared.status_code, streamed.status_code) == (413, 413)
    assert "overLimit" in streamed.json()
    assert (shown["status"], shown["size"], shown["checksum"]) == (before, None, None)
    assert list(settings.images.store_dir.iterdir()) == []


async def test_an_image_without_data_downloads_as_204_and_members_cannot_upload(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool)

    empty = await client.get(_file(), headers=MEMBER)
    refused = await client.put(_file(), headers=MEMBER, content=b"data")

    assert empty.status_code == 204
    assert refused.status_code == 403


async def test_signed_urls_serve_data_and_refuse_expired_and_forged_ones(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    image_id = UUID(await _without_data(client))
    await client.put(_file(image_id), headers=ADMIN, content=DATA)
    good = image_urls.signed_url("http://keel.test", SECRET, image_id, 60)
    expired = image_urls.signed_url("http://keel.test", SECRET, image_id, 60, now=time.time() - 120)
    forged = image_urls.signed_url(
        "http://keel.test", "another-secret-of-32-characters", image_id, 60
    )

    with caplog.at_level(logging.WARNING):
        fetched = await client.get(good)
        too_late = await client.get(expired)
        fake = await client.get(forged)
        bare = await client.get(f"{image_urls.DOWNLOAD_PATH}/{image_id}")

    assert fetched.status_code == 200
    assert fetched.content == DATA
    assert [a.status_code for a in (too_late, fake, bare)] == [403, 403, 403]
    refusals = [r.getMessage() for r in caplog.records if "refused a download" in r.getMessage()]
    assert any("has expired" in line for line in refusals)
    assert any("signature does not match" in line for line in refusals)


async def test_deleting_an_image_removes_its_data(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    image_id = await _without_data(client)
    await client.put(f"/image/v2/images/{image_id}/file", headers=ADMIN, content=b"bytes")

    deleted = await client.delete(f"/image/v2/images/{image_id}", headers=ADMIN)

    assert deleted.status_code == 204
    assert list(settings.images.store_dir.iterdir()) == []


async def test_an_upload_whose_database_call_fails_once_is_503_and_can_be_retried(
    client: httpx.AsyncClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_id = await _without_data(client)
    real = images_db.finish_upload
    calls = 0

    async def fails_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost mid-query")
        return await real(*args, **kwargs)

    monkeypatch.setattr(images_db, "finish_upload", fails_once)
    failed = await client.put(_file(UUID(image_id)), headers=ADMIN, content=DATA)
    shown = (await client.get(f"/image/v2/images/{image_id}", headers=ADMIN)).json()
    left = list(settings.images.store_dir.iterdir())
    retried = await client.put(_file(UUID(image_id)), headers=ADMIN, content=DATA)
    got = await client.get(_file(UUID(image_id)), headers=ADMIN)

    assert failed.status_code == 503, failed.text
    assert (shown["checksum"], shown["size"]) == (None, None)
    assert shown["status"] != "saving"
    assert left == []
    assert retried.status_code == 204, retried.text
    assert got.content == DATA
    assert [p.name for p in settings.images.store_dir.iterdir()] == [image_id]
