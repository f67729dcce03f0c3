"""A row of ``aggregates``: a named set of compute hosts with metadata."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from shared.objects.base import KeelModel

#: The metadata key that puts an aggregate's hosts in an availability zone.
ZONE_KEY = "availability_zone"


class Aggregate(KeelModel):
    id: int
    uuid: UUID
    name: str
    created_at: datetime
    updated_at: datetime | None = None
    deleted_at: datetime | None = None
    #: The host names of its compute services, and those services' ids.
    hosts: list[str] = Field(default_factory=list)
    service_ids: list[int] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def availability_zone(self) -> str | None:
        return self.metadata.get(ZONE_KEY)
