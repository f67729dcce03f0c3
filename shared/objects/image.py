"""A row of ``images``: image metadata only; keel stores no image data."""

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
