"""A row of ``services``: one running keel process kind on one host."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from shared.objects.base import KeelModel


class Binary(StrEnum):
    CONDUCTOR = "keel-conductor"
    SCHEDULER = "keel-scheduler"
    COMPUTE = "keel-compute"
    #: keel-api reports its version like every service, but the compute API's
    #: os-services does not show it (as Nova does not show its API services).
    API = "keel-api"


#: Nova's names for the same services, so tools written for Nova find keel's.
NOVA_BINARIES = {
    "nova-compute": Binary.COMPUTE,
    "nova-conductor": Binary.CONDUCTOR,
    "nova-scheduler": Binary.SCHEDULER,
}


def canonical_binary(name: str) -> str:
    """keel's name for a service binary given by Nova's name (or by keel's: unchanged)."""
    alias = NOVA_BINARIES.get(name)
    return alias.value if alias is not None else name


class Service(KeelModel):
    id: int
    uuid: UUID
    host: str
    binary: str
    topic: str
    version: int
    disabled: bool
    disabled_reason: str | None
    forced_down: bool
    last_seen_up: datetime | None
    report_count: int
    created_at: datetime
    updated_at: datetime | None
    #: A compute agent's self-fencing window as it last reported it (0: it never fences
    #: itself; ``None``: its release does not say).
    self_fence_after: float | None = None
    #: The lease of the host's fence as the agent's last heartbeat reported it (``None``:
    #: no armed fence then).
    fence_lease: float | None = None
    #: Computed by the query against the database clock: heartbeat recent and not forced down.
    is_up: bool = False
