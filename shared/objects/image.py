"""A row of ``images``: an image's metadata, and the hashes of its data once uploaded."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from shared.objects.base import KeelModel


class Image(KeelModel):
    id: UUID
    name: str | None
    status: str
    visibility: str
    disk_format: str | None
    container_format: str | None
    min_disk: int
    min_ram: int
    size: int | None
    owner: str | None
    properties: dict[str, Any]
    created_at: datetime
    updated_at: datetime | None
    #: MD5 (``checksum``) and SHA-512 (``os_hash_value``) of the data; ``None`` without.
    checksum: str | None = None
    os_hash_algo: str | None = None
    os_hash_value: str | None = None

    @property
    def has_data(self) -> bool:
        return self.status == "active" and self.checksum is not None
