"""The test guest as images of the local cloud, for ``KEEL_COMPUTE__DRIVER=libvirt``.

``make run`` with the libvirt driver builds the guest if ``<workdir>/images/`` lacks it
(:mod:`guestimage`, what ``make image`` runs) and registers three public images with
their data in keel-api's image store, unless they are there already:
``keel-test-kernel`` and ``keel-test-ramdisk`` (direct kernel boot), and ``keel-test``,
the disk servers boot from, whose ``kernel_id`` and ``ramdisk_id`` name the other two.
Their ids are fixed, so every run finds them again.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import uuid
from pathlib import Path
from typing import Any

import guestimage

from services.manage.database import connect
from shared.db import images
from shared.exceptions import ImageNotFound

KERNEL_ID = uuid.UUID("4ee10000-0000-4000-8000-00000000a001")
RAMDISK_ID = uuid.UUID("4ee10000-0000-4000-8000-00000000a002")
DISK_ID = uuid.UUID("4ee10000-0000-4000-8000-00000000a003")


def build_guest(images_dir: Path) -> bool:
    """The test guest in ``images_dir``, built if missing; False if it cannot be."""
    return guestimage.main(["--output", str(images_dir)]) == 0


def _copy_in(source: Path, target: Path) -> tuple[int, str, str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return _hashes(source)


def _hashes(path: Path) -> tuple[int, str, str]:
    md5, sha512, size = hashlib.md5(usedforsecurity=False), hashlib.sha512(), 0
    with path.open("rb") as data:
        while chunk := data.read(1024 * 1024):
            md5.update(chunk)
            sha512.update(chunk)
            size += len(chunk)
    return size, md5.hexdigest(), sha512.hexdigest()


async def _register(
    database_url: str, store: Path, image_id: uuid.UUID, name: str, source: Path, **fields: Any
) -> bool:
    async with connect(database_url) as conn:
        try:
            if (await images.get(conn, image_id)).has_data:
                return False
        except ImageNotFound:
            await images.create(conn, image_id=image_id, name=name, **fields)
        began = await images.begin_upload(conn, image_id)
        if began is None:
            return False
        size, md5, sha512 = await asyncio.to_thread(_copy_in, source, store / str(image_id))
        await images.finish_upload(
            conn, image_id, began[0], size=size, checksum=md5, os_hash_value=sha512
        )
    return True


async def register_guest(database_url: str, store: Path, images_dir: Path) -> list[str]:
    """Register the three images (with data) that are missing; the names registered."""
    done = []
    for image_id, name, file, fields in (
        (KERNEL_ID, "keel-test-kernel", guestimage.KERNEL, {"disk_format": "aki"}),
        (RAMDISK_ID, "keel-test-ramdisk", guestimage.RAMDISK, {"disk_format": "ari"}),
        (
            DISK_ID,
            "keel-test",
            guestimage.DISK,
            {
                "disk_format": "qcow2",
                "properties": {"kernel_id": str(KERNEL_ID), "ramdisk_id": str(RAMDISK_ID)},
            },
        ),
    ):
        if await _register(database_url, store, image_id, name, images_dir / file, **fields):
            done.append(name)
    return done
