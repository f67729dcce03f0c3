"""Hand-built host states and request specs for scheduler unit tests."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime

from shared.objects.compute_node import ComputeNode, HostState
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from shared.objects.service import Service

_ids = itertools.count(1)


def make_host(
    host: str = "host1",
    *,
    vcpus: int = 8,
    memory_mb: int = 16384,
    local_gb: int = 200,
    vcpus_used: int = 0,
    memory_mb_used: int = 0,
    local_gb_used: int = 0,
    cpu_allocation_ratio: float = 1.0,
    ram_allocation_ratio: float = 1.0,
    disk_allocation_ratio: float = 1.0,
    availability_zone: str = "nova",
    disabled: bool = False,
    forced_down: bool = False,
    is_up: bool = True,
) -> HostState:
    now = datetime.now(UTC)
    service_id = next(_ids)
    service = Service(
        id=service_id,
        uuid=uuid.uuid4(),
        host=host,
        binary="keel-compute",
        topic="compute",
        version=1,
        disabled=disabled,
        disabled_reason="maintenance" if disabled else None,
        forced_down=forced_down,
        last_seen_up=now,
        report_count=1,
        created_at=now,
        updated_at=None,
        is_up=is_up,
    )
    node = ComputeNode(
        id=next(_ids),
        uuid=uuid.uuid4(),
        service_id=service_id,
        host=host,
        hypervisor_hostname=f"{host}.example.org",
        hypervisor_type="keel",
        availability_zone=availability_zone,
        vcpus=vcpus,
        memory_mb=memory_mb,
        local_gb=local_gb,
        vcpus_used=vcpus_used,
        memory_mb_used=memory_mb_used,
        local_gb_used=local_gb_used,
        running_vms=0,
        cpu_allocation_ratio=cpu_allocation_ratio,
        ram_allocation_ratio=ram_allocation_ratio,
        disk_allocation_ratio=disk_allocation_ratio,
        created_at=now,
        updated_at=None,
    )
    return HostState(node=node, service=service)


def make_spec(
    *,
    vcpus: int = 1,
    memory_mb: int = 512,
    root_gb: int = 1,
    ephemeral_gb: int = 0,
    availability_zone: str | None = None,
    ignore_hosts: list[str] | None = None,
    ignore_nodes: list[uuid.UUID] | None = None,
) -> RequestSpec:
    return RequestSpec(
        instance_uuid=uuid.uuid4(),
        project_id="project",
        user_id="user",
        flavor=FlavorSnapshot(
            flavorid="f1",
            name="test.flavor",
            vcpus=vcpus,
            memory_mb=memory_mb,
            root_gb=root_gb,
            ephemeral_gb=ephemeral_gb,
        ),
        availability_zone=availability_zone,
        ignore_hosts=ignore_hosts or [],
        ignore_nodes=ignore_nodes or [],
    )
