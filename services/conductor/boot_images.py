"""What a guest boots from, with signed download URLs: the ``boot`` of a build.

For an image with data (uploaded to keel-api), the conductor gives the agent its id,
hashes and a download URL signed with ``KEEL_IMAGES__URL_SECRET`` and valid for
``KEEL_IMAGES__URL_TTL`` seconds (:mod:`shared.image_urls`), and the same for the kernel
and ramdisk the image names in its ``kernel_id`` and ``ramdisk_id`` properties, as Nova
honours them for direct kernel boot; ``os_command_line`` becomes the kernel's command
line. Without a secret, or for an image registered without data, the build carries no
``boot``: the local and fake drivers need none, and the libvirt driver refuses, saying
why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

from services.compute.rpcapi import BootSource, ImageFile
from shared import image_urls
from shared.config import Settings
from shared.db import images
from shared.db.pool import Connection
from shared.exceptions import BuildFailed, ImageNotFound
from shared.objects.image import Image

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class BootImages:
    secret: str | None
    base_url: str
    ttl: float

    @classmethod
    def from_settings(cls, settings: Settings) -> BootImages:
        return cls(
            secret=settings.images.url_secret,
            base_url=settings.image_download_url,
            ttl=settings.images.url_ttl,
        )

    def _file(self, image: Image, secret: str) -> ImageFile:
        return ImageFile(
            id=image.id,
            name=image.name,
            url=image_urls.signed_url(self.base_url, secret, image.id, self.ttl),
            size=image.size,
            disk_format=image.disk_format,
            checksum=image.checksum,
            os_hash_algo=image.os_hash_algo,
            os_hash_value=image.os_hash_value,
        )

    async def _part(
        self, conn: Connection, owner: Image, key: str, secret: str
    ) -> ImageFile | None:
        ref = owner.properties.get(key)
        if not ref:
            return None
        try:
            part = await images.get(conn, UUID(str(ref)))
        except (ValueError, ImageNotFound):
            raise BuildFailed(f"image {owner.id} names {key} {ref}, which does not exist") from None
        if not part.has_data:
            raise BuildFailed(f"image {owner.id} names {key} {ref}, which has no data")
        return self._file(part, secret)

    async def source(self, conn: Connection, image_ref: str) -> BootSource | None:
        """The boot source of ``image_ref``; ``None`` when there is nothing to download."""
        if self.secret is None or not image_ref:
            return None
        try:
            image = await images.get(conn, UUID(image_ref))
        except (ValueError, ImageNotFound):
            return None
        if not image.has_data:
            return None
        kernel = await self._part(conn, image, "kernel_id", self.secret)
        ramdisk = await self._part(conn, image, "ramdisk_id", self.secret)
        args = image.properties.get("os_command_line")
        return BootSource(
            image=self._file(image, self.secret),
            kernel=kernel,
            ramdisk=ramdisk,
            kernel_args=str(args) if args else None,
        )
