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


def stored_properties(
    extra: dict[str, Any], *, tags: list[str], protected: bool, os_hidden: bool
) -> dict[str, Any]:
    """An image's ``properties`` column: its extra properties, and the flags and tags
    the Image API shows as fields of their own, each only where set."""
    props = dict(extra)
    if tags:
        props["tags"] = list(tags)
    if protected:
        props["protected"] = True
    if os_hidden:
        props["os_hidden"] = True
    return props
