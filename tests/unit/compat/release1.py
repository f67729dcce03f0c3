"""Frozen copies of release 1 (``arbor``): its messages and its stored JSON and rows.

These are the shapes release 1 wrote and read, field for field, kept here unchanged so
the tests can show that release 1 and this release understand each other: each reads
what the other writes. They follow the compatibility rule every release follows
(unknown fields are ignored; see :mod:`shared.rpc`). Never edit them to make a test
pass: a failure means this release broke a rolling upgrade.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class _Release1(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RequestContext(_Release1):
    request_id: str
    user_id: str | None = None
    project_id: str | None = None
    roles: tuple[str, ...] = ()


class Envelope(_Release1):
    method: str
    version: str
    context: RequestContext
    args: dict[str, Any] = Field(default_factory=dict)
    deadline: float | None = None


class FlavorSnapshot(_Release1):
    flavorid: str
    name: str
    vcpus: int = Field(gt=0)
    memory_mb: int = Field(gt=0)
    root_gb: int = Field(ge=0)
    ephemeral_gb: int = Field(default=0, ge=0)
    swap: int = Field(default=0, ge=0)
    extra_specs: dict[str, str] = Field(default_factory=dict)


class InstanceSpec(_Release1):
    uuid: UUID
    display_name: str = Field(max_length=255)
    flavor: FlavorSnapshot
    image_ref: str = ""
    node: str


class BuildAndRunInstance(_Release1):
    instance: InstanceSpec


class TerminateInstance(_Release1):
    instance_uuid: UUID


class NodeResources(_Release1):
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


class RegisterCompute(_Release1):
    host: str = Field(min_length=1, max_length=255)
    node_uuid: UUID
    version: int = Field(ge=0)
    resources: NodeResources


class Registration(_Release1):
    service_uuid: UUID
    service_id: int
    node_uuid: UUID
    node_id: int


class ServiceHeartbeat(_Release1):
    service_uuid: UUID
    version: int = Field(ge=0)
    node_uuid: UUID | None = None
    resources: NodeResources | None = None


class InstanceBuildResult(_Release1):
    instance_uuid: UUID
    success: bool
    message: str = ""


class InstanceDeleted(_Release1):
    instance_uuid: UUID


class RequestSpec(_Release1):
    """Stored as JSON in ``request_specs.spec``."""

    instance_uuid: UUID
    project_id: str
    user_id: str
    flavor: FlavorSnapshot
    image_ref: str = ""
    availability_zone: str | None = None
    ignore_hosts: list[str] = Field(default_factory=list)


class InstanceFault(_Release1):
    """Stored as JSON in ``instances.fault``."""

    code: int = 500
    message: str
    details: str = ""
    created: datetime


class Instance(_Release1):
    """A row of ``instances`` as release 1 read it."""

    id: int
    uuid: UUID
    project_id: str
    user_id: str
    display_name: str
    host: str | None
    node: str | None
    vm_state: str
    task_state: str | None
    power_state: int
    flavor: FlavorSnapshot
    image_ref: str
    availability_zone: str | None
    fault: InstanceFault | None
    launched_at: datetime | None
    terminated_at: datetime | None
    created_at: datetime
    updated_at: datetime | None
    deleted_at: datetime | None
