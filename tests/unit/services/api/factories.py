"""Rows as the database would return them, for shaping and validation tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from shared.objects.compute_node import ComputeNode, HostState
from shared.objects.flavor import Flavor, FlavorSnapshot
from shared.objects.image import Image
from shared.objects.instance import Instance
from shared.objects.service import Service

CREATED = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
INSTANCE_UUID = uuid.UUID("6f1a5e2c-0000-4000-8000-000000000001")
IMAGE_ID = uuid.UUID("11111111-2222-3333-4444-555555555555")
SERVICE_UUID = uuid.UUID("aaaaaaaa-0000-4000-8000-000000000001")
NODE_UUID = uuid.UUID("bbbbbbbb-0000-4000-8000-000000000002")


def instance(**changes: Any) -> Instance:
    fields: dict[str, Any] = {
        "id": 7,
        "uuid": INSTANCE_UUID,
        "project_id": "team",
        "user_id": "alice",
        "display_name": "web-1",
        "host": None,
        "node": None,
        "vm_state": "building",
        "task_state": "scheduling",
        "power_state": 0,
        "flavor": FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1),
        "image_ref": str(IMAGE_ID),
        "availability_zone": None,
        "fault": None,
        "launched_at": None,
        "terminated_at": None,
        "created_at": CREATED,
        "updated_at": None,
        "deleted_at": None,
    }
    return Instance(**{**fields, **changes})


def flavor(**changes: Any) -> Flavor:
    fields: dict[str, Any] = {
        "id": 1,
        "flavorid": "1",
        "name": "m1.tiny",
        "vcpus": 1,
        "memory_mb": 512,
        "root_gb": 1,
        "ephemeral_gb": 0,
        "swap": 0,
        "rxtx_factor": 1.0,
        "is_public": True,
        "disabled": False,
        "description": "small",
        "extra_specs": {"hw:cpu_policy": "shared"},
        "created_at": CREATED,
        "updated_at": None,
    }
    return Flavor(**{**fields, **changes})


def image(**changes: Any) -> Image:
    fields: dict[str, Any] = {
        "id": IMAGE_ID,
        "name": "cirros",
        "status": "active",
        "visibility": "public",
        "disk_format": "qcow2",
        "container_format": "bare",
        "min_disk": 1,
        "min_ram": 64,
        "size": 1024,
        "owner": "ops",
        "properties": {},
        "created_at": CREATED,
        "updated_at": None,
    }
    return Image(**{**fields, **changes})


def service(**changes: Any) -> Service:
    fields: dict[str, Any] = {
        "id": 3,
        "uuid": SERVICE_UUID,
        "host": "compute-1",
        "binary": "keel-compute",
        "topic": "compute",
        "version": 1,
        "disabled": False,
        "disabled_reason": None,
        "forced_down": False,
        "last_seen_up": datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
        "report_count": 4,
        "created_at": CREATED,
        "updated_at": None,
        "is_up": True,
    }
    return Service(**{**fields, **changes})


def host_state(*, up: bool = True, disabled: bool = False) -> HostState:
    node = ComputeNode(
        id=5,
        uuid=NODE_UUID,
        service_id=3,
        host="compute-1",
        hypervisor_hostname="compute-1.example",
        hypervisor_type="keel",
        availability_zone="nova",
        vcpus=8,
        memory_mb=16384,
        local_gb=100,
        vcpus_used=2,
        memory_mb_used=1024,
        local_gb_used=10,
        running_vms=2,
        cpu_allocation_ratio=4.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
        created_at=CREATED,
        updated_at=None,
    )
    owner = service(
        is_up=up, disabled=disabled, disabled_reason="maintenance" if disabled else None
    )
    return HostState(node=node, service=owner)
