"""A row of ``compute_nodes``, and the resources an agent reports for it."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from shared.objects.base import KeelModel
from shared.objects.service import Service


class NodeResources(KeelModel):
    """What an agent's hypervisor has in total, as it reports it."""

    hypervisor_hostname: str = Field(min_length=1, max_length=255)
    hypervisor_type: str = "keel"
    vcpus: int = Field(ge=0)
    memory_mb: int = Field(ge=0)
    local_gb: int = Field(ge=0)
    cpu_allocation_ratio: float = Field(gt=0)
    ram_allocation_ratio: float = Field(gt=0)
    disk_allocation_ratio: float = Field(gt=0)
    availability_zone: str = "nova"
    running_vms: int = Field(default=0, ge=0)


class ComputeNode(KeelModel):
    id: int
    uuid: UUID
    service_id: int | None
    host: str
    hypervisor_hostname: str
    hypervisor_type: str
    availability_zone: str
    vcpus: int
    memory_mb: int
    local_gb: int
    vcpus_used: int
    memory_mb_used: int
    local_gb_used: int
    running_vms: int
    cpu_allocation_ratio: float
    ram_allocation_ratio: float
    disk_allocation_ratio: float
    created_at: datetime
    updated_at: datetime | None
    #: Set when an operator deleted the node (with its service); its UUID is never reused.
    deleted_at: datetime | None = None

    @property
    def free_vcpus(self) -> float:
        return self.vcpus * self.cpu_allocation_ratio - self.vcpus_used

    @property
    def free_ram_mb(self) -> float:
        return self.memory_mb * self.ram_allocation_ratio - self.memory_mb_used

    @property
    def free_disk_gb(self) -> float:
        return self.local_gb * self.disk_allocation_ratio - self.local_gb_used


class HostState(KeelModel):
    """A compute node with its service, as the scheduler and hypervisor API see it."""

    node: ComputeNode
    service: Service
    #: The metadata of the host's aggregates, key → every value the aggregates give it
    #: (read by the scheduler's candidate query; empty elsewhere).
    aggregate_metadata: dict[str, list[str]] = Field(default_factory=dict)


class NodeTotals(KeelModel):
    """Sums over the nodes of enabled compute services (os-hypervisors/statistics)."""

    count: int
    vcpus: int
    memory_mb: int
    local_gb: int
    vcpus_used: int
    memory_mb_used: int
    local_gb_used: int
    running_vms: int
