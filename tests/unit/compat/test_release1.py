"""Release 1 and this release read each other's messages and stored rows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from services.compute.rpcapi import BuildAndRunInstance, InstanceSpec, TerminateInstance
from services.conductor.rpcapi import (
    InstanceBuildResult,
    RegisterCompute,
    Registration,
    ServiceHeartbeat,
)
from shared.context import RequestContext
from shared.objects.compute_node import NodeResources
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance, InstanceFault, RequestSpec
from shared.objects.network import FixedIp
from shared.rpc.envelope import Envelope
from tests.unit.compat import release1

FLAVOR = FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1)
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _wire(model: BaseModel) -> str:
    return model.model_dump_json()


def _build_now() -> BuildAndRunInstance:
    return BuildAndRunInstance(
        instance=InstanceSpec(
            uuid=uuid.uuid4(),
            display_name="web",
            flavor=FLAVOR,
            image_ref="cirros",
            node="compute1",
            addresses=[
                FixedIp(
                    network_id=uuid.uuid4(),
                    network_name="private",
                    address="10.0.0.5",
                    mac="fa:16:3e:00:00:05",
                )
            ],
            metadata={"role": "web"},
            user_data="aGVsbG8=",
        )
    )


def test_release1_reads_a_build_of_this_release_without_its_new_fields() -> None:
    now = _build_now()
    old = release1.BuildAndRunInstance.model_validate_json(_wire(now))
    assert old.instance.uuid == now.instance.uuid
    assert old.instance.flavor.model_dump() == FLAVOR.model_dump()


def test_this_release_reads_a_release1_build_with_defaults() -> None:
    old = release1.BuildAndRunInstance(
        instance=release1.InstanceSpec(
            uuid=uuid.uuid4(),
            display_name="web",
            flavor=release1.FlavorSnapshot(**FLAVOR.model_dump()),
            node="compute1",
        )
    )
    now = BuildAndRunInstance.model_validate_json(_wire(old))
    assert (now.instance.addresses, now.instance.metadata, now.instance.user_data) == (
        [],
        {},
        None,
    )


def test_envelopes_cross_both_ways() -> None:
    ctx = RequestContext(user_id="u", project_id="p", roles=("member",))
    now = Envelope(
        method="terminate_instance",
        version="1.0",
        context=ctx,
        args=TerminateInstance(instance_uuid=uuid.uuid4()).model_dump(mode="json"),
        timeout=30.0,
    )
    old = release1.Envelope.model_validate_json(_wire(now))
    assert (old.method, old.version, old.context.request_id) == (
        "terminate_instance",
        "1.0",
        ctx.request_id,
    )
    assert old.deadline is None  # a release-1 server never drops a call it cannot time
    back = Envelope.model_validate_json(_wire(old.model_copy(update={"deadline": 1.8e9})))
    assert (back.method, back.context, back.timeout) == ("terminate_instance", ctx, None)


def test_agent_messages_of_release1_reach_this_conductor() -> None:
    resources = release1.NodeResources(
        hypervisor_hostname="compute1",
        vcpus=4,
        memory_mb=8192,
        local_gb=100,
        cpu_allocation_ratio=4.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
    )
    register = release1.RegisterCompute(
        host="compute1", node_uuid=uuid.uuid4(), version=1, resources=resources
    )
    beat = release1.ServiceHeartbeat(service_uuid=uuid.uuid4(), version=1, resources=resources)
    result = release1.InstanceBuildResult(instance_uuid=uuid.uuid4(), success=True)

    assert RegisterCompute.model_validate_json(_wire(register)).version == 1
    assert ServiceHeartbeat.model_validate_json(_wire(beat)).resources is not None
    assert InstanceBuildResult.model_validate_json(_wire(result)).success


def test_this_conductors_answers_reach_a_release1_agent() -> None:
    answer = Registration(
        service_uuid=uuid.uuid4(), service_id=1, node_uuid=uuid.uuid4(), node_id=1
    )
    assert release1.Registration.model_validate_json(_wire(answer)).node_id == 1
    now = NodeResources(
        hypervisor_hostname="n",
        vcpus=1,
        memory_mb=1,
        local_gb=1,
        cpu_allocation_ratio=1,
        ram_allocation_ratio=1,
        disk_allocation_ratio=1,
    )
    assert release1.NodeResources.model_validate_json(_wire(now)).vcpus == 1


def _row_written_now() -> dict[str, Any]:
    """An ``instances`` row as this release writes it: more columns than release 1 knew."""
    return {
        "id": 7,
        "uuid": uuid.uuid4(),
        "project_id": "p",
        "user_id": "u",
        "display_name": "web",
        "host": "compute1",
        "node": "compute1",
        "vm_state": "stopped",
        "task_state": None,
        "power_state": 4,
        "flavor": FLAVOR.model_dump(mode="json"),
        "image_ref": "cirros",
        "availability_zone": "nova",
        "fault": InstanceFault(message="once failed", created=NOW).model_dump(mode="json"),
        "launched_at": NOW,
        "terminated_at": None,
        "created_at": NOW,
        "updated_at": NOW,
        "deleted_at": None,
        "metadata": {"role": "web"},
        "description": "front end",
        "tags": ["prod"],
        "user_data": None,
        "key_name": "laptop",
    }


def test_release1_reads_rows_and_json_this_release_writes() -> None:
    row = _row_written_now()
    old = release1.Instance.model_validate(row)
    assert (old.vm_state, old.fault is not None) == ("stopped", True)
    spec = RequestSpec(instance_uuid=row["uuid"], project_id="p", user_id="u", flavor=FLAVOR)
    stored = spec.model_dump(mode="json") | {"requested_destination": {"host": "b"}}
    assert release1.RequestSpec.model_validate(stored).flavor.vcpus == 1


def test_this_release_reads_rows_and_json_release1_wrote() -> None:
    row = {k: v for k, v in _row_written_now().items() if k in release1.Instance.model_fields}
    now = Instance.model_validate(row)
    assert (now.metadata, now.tags, now.key_name) == ({}, [], None)
    old_spec = release1.RequestSpec(
        instance_uuid=row["uuid"],
        project_id="p",
        user_id="u",
        flavor=release1.FlavorSnapshot(**FLAVOR.model_dump()),
    )
    assert RequestSpec.model_validate(old_spec.model_dump(mode="json")).flavor == FLAVOR
