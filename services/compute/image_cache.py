"""The agent's image cache: base images fetched once, verified every time they are used.

Images are fetched from keel-api with the short-lived signed URL a build carries (an
agent holds no API credentials), streamed to a scratch file while their hashes are
computed, and kept only if the hashes and size match what the image record says:
SHA-512 (``os_hash_value``) when the image has one, else MD5 (``checksum``). An image
with neither is refused: its data cannot be trusted.

A cached file is hashed again each time a guest is built from it; one whose hash no
longer matches (a damaged disk, a hand edit) is discarded, logged, and fetched again.
Guests never use the cache's files directly: the driver hard-links them into the guest's
own directory, so evicting a cached image never touches a guest. The cache holds at most
``KEEL_COMPUTE__IMAGE_CACHE_GB``; after each fetch the least recently used images go
first (never the one just fetched). All file work runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import urllib.error
import urllib.request
from pathlib import Path
from uuid import UUID

from services.compute.rpcapi import ImageFile
from shared.exceptions import BuildFailed

LOG = logging.getLogger(__name__)

CHUNK = 1024 * 1024
#: Seconds one read from keel-api may take before the download fails.
READ_TIMEOUT = 60.0
_SCRATCH = ".fetch-"


class Digests:
    """The hashes an image record carries, checked against data as it streams by."""

    def __init__(self, image: ImageFile) -> None:
        self.image = image
        self.sha512 = hashlib.sha512() if image.os_hash_value else None
        self.md5 = hashlib.md5(usedforsecurity=False) if not image.os_hash_value else None
        self.size = 0
        if image.os_hash_value and (image.os_hash_algo or "sha512") != "sha512":
            raise BuildFailed(
                f"image {image.id} is hashed with {image.os_hash_algo}, which this agent "
                "cannot verify (it verifies sha512 and md5)"
            )
        if not image.os_hash_value and not image.checksum:
            raise BuildFailed(
                f"image {image.id} has no checksum or os_hash_value: its data cannot be "
                "verified, so it is not used"
            )

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        for digest in (self.sha512, self.md5):
            if digest is not None:
                digest.update(chunk)

    def mismatch(self) -> str | None:
        """Why the data seen does not match the record; ``None`` when it does."""
        image = self.image
        if image.size is not None and self.size != image.size:
            return f"{self.size} bytes instead of {image.size}"
        if self.sha512 is not None and self.sha512.hexdigest() != image.os_hash_value:
            return f"sha512 {self.sha512.hexdigest()[:16]}… instead of {image.os_hash_value}"
        if self.md5 is not None and self.md5.hexdigest() != image.checksum:
            return f"md5 {self.md5.hexdigest()} instead of {image.checksum}"
        return None


class ImageCache:
    def __init__(self, directory: Path, *, cap_bytes: int) -> None:
        self.directory = directory
        self.cap_bytes = cap_bytes
        self._locks: dict[UUID, asyncio.Lock] = {}

    def path(self, image_id: UUID) -> Path:
        return self.directory / str(image_id)

    async def fetch(self, image: ImageFile) -> Path:
        """The verified cached file of ``image``, fetched if missing or damaged."""
        lock = self._locks.setdefault(image.id, asyncio.Lock())
        async with lock:
            path = await asyncio.to_thread(self._verified_or_discarded, image)
            if path is None:
                path = await asyncio.to_thread(self._download, image)
                await asyncio.to_thread(self._evict, keep=path)
            return path

    def _verified_or_discarded(self, image: ImageFile) -> Path | None:
        path = self.path(image.id)
        digests = Digests(image)
        try:
            with path.open("rb") as data:
                while chunk := data.read(CHUNK):
                    digests.update(chunk)
        except FileNotFoundError:
            return None
        wrong = digests.mismatch()
        if wrong is None:
            os.utime(path)
            return path
        LOG.warning(
            "cached image %s no longer matches its record (%s): discarding it and "
            "fetching it again",
            image.id,
            wrong,
            extra={"decision": "image_cache_discarded"},
        )
        path.unlink(missing_ok=True)
        return None

    def _download(self, image: ImageFile) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        scratch = self.directory / f"{_SCRATCH}{image.id}-{secrets.token_hex(4)}"
        digests = Digests(image)
        try:
            with _open(image) as answer, scratch.open("xb") as out:
                while chunk := answer.read(CHUNK):
                    digests.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            wrong = digests.mismatch()
            if wrong is not None:
                raise BuildFailed(
                    f"image {image.id} as downloaded does not match its record ({wrong}); "
                    "it was not used"
                )
            final = self.path(image.id)
            scratch.replace(final)
        finally:
            scratch.unlink(missing_ok=True)
        LOG.info("fetched image %s (%d bytes) into the image cache", image.id, digests.size)
        return final

    def _evict(self, *, keep: Path) -> None:
        """Remove least recently used images until the cache fits its cap."""
        entries = []
        for entry in self.directory.iterdir():
            if entry.name.startswith(_SCRATCH) or entry == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                entries.append((entry.stat().st_mtime, entry.stat().st_size, entry))
        total = sum(size for _, size, _ in entries) + keep.stat().st_size
        for _, size, entry in sorted(entries):
            if total <= self.cap_bytes:
                break
            entry.unlink(missing_ok=True)
            total -= size
            LOG.info("removed image %s from the image cache (least recently used)", entry.name)

    def sweep(self) -> None:
        """Remove scratch files a crashed download left (at agent start-up)."""
        if self.directory.is_dir():
            for entry in self.directory.glob(f"{_SCRATCH}*"):
                entry.unlink(missing_ok=True)


def _open(image: ImageFile) -> contextlib.AbstractContextManager[urllib.response.addinfourl]:
    if not image.url.startswith(("http://", "https://")):
        raise BuildFailed(f"image {image.id} has no usable download URL")
    try:
        answer: urllib.response.addinfourl = urllib.request.urlopen(image.url, timeout=READ_TIMEOUT)
    except urllib.error.HTTPError as exc:
        why = "expired or refused" if exc.code == 403 else exc.reason
        raise BuildFailed(
            f"keel-api refused the download of image {image.id}: {exc.code} ({why})"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BuildFailed(f"cannot download image {image.id} from keel-api: {reason}") from None
    return answer
