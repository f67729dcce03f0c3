"""A row of ``flavors``, and the snapshot of it an instance keeps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from shared.objects.base import KeelModel


class FlavorSnapshot(KeelModel):
    """The flavor as it was when the instance was created (it may change or go later)."""

    flavorid: str
    name: str
    vcpus: int = Field(gt=0)
    memory_mb: int = Field(gt=0)
    root_gb: int = Field(ge=0)
    ephemeral_gb: int = Field(default=0, ge=0)
    swap: int = Field(default=0, ge=0)
    extra_specs: dict[str, str] = Field(default_factory=dict)

    @property
    def disk_gb(self) -> int:
        """Local disk the flavor takes on a host: its root disk plus its ephemeral disk."""
        return self.root_gb + self.ephemeral_gb


class Flavor(KeelModel):
    id: int
    flavorid: str
    name: str
    vcpus: int
    memory_mb: int
    root_gb: int
    ephemeral_gb: int
    swap: int
    rxtx_factor: float
    is_public: bool
    disabled: bool
    description: str | None
    extra_specs: dict[str, Any]
    created_at: datetime
    updated_at: datetime | None

    def snapshot(self) -> FlavorSnapshot:
        return FlavorSnapshot(
            flavorid=self.flavorid,
            name=self.name,
            vcpus=self.vcpus,
            memory_mb=self.memory_mb,
            root_gb=self.root_gb,
            ephemeral_gb=self.ephemeral_gb,
            swap=self.swap,
            extra_specs={str(k): str(v) for k, v in self.extra_specs.items()},
        )
