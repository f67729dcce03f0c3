"""os-hypervisors bodies, from a compute node and its service.

Ids are integers below 2.53 and node UUIDs from 2.53 (the embedded service's id
follows the same rule). ``cpu_info`` is a JSON string below 2.28 and an object from 2.28;
from 2.88 the detail has ``uptime`` instead of ``cpu_info`` and the capacity figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.api.http.microversion import APIVersion
from services.api.servers.views import instance_name
from shared.objects.compute_node import HostState, NodeTotals
from shared.objects.instance import Instance

HYPERVISOR_VERSION = 1
#: From this microversion hypervisors show no capacity or usage figures (they were often
#: misleading; placement has the true ones) but their host's uptime, and the
#: ``statistics`` and ``{id}/uptime`` routes are gone.
NO_STATISTICS_VERSION = "2.88"


def hypervisor_id(state: HostState, version: APIVersion) -> int | str:
    return str(state.node.uuid) if version.at_least("2.53") else state.node.id


def hypervisor_view(
    state: HostState, version: APIVersion, *, detail: bool, uptime: str | None = None
) -> dict[str, Any]:
    """The hypervisor at ``version``; ``uptime`` (its host's, as the agent said it) is
    shown in the detail from 2.88, where the capacity and usage figures leave it."""
    node, service = state.node, state.service
    body: dict[str, Any] = {
        "id": hypervisor_id(state, version),
        "hypervisor_hostname": node.hypervisor_hostname,
        "state": "up" if service.is_up else "down",
        "status": "disabled" if service.disabled else "enabled",
    }
    if not detail:
        return body
    uuid_ids = version.at_least("2.53")
    body.update(
        {
            "hypervisor_type": node.hypervisor_type,
            "hypervisor_version": HYPERVISOR_VERSION,
            "host_ip": None,
            "service": {
                "host": service.host,
                "id": str(service.uuid) if uuid_ids else service.id,
                "disabled_reason": service.disabled_reason,
            },
        }
    )
    if version.at_least(NO_STATISTICS_VERSION):
        body["uptime"] = uptime
        return body
    body.update(
        {
            "vcpus": node.vcpus,
            "vcpus_used": node.vcpus_used,
            "memory_mb": node.memory_mb,
            "memory_mb_used": node.memory_mb_used,
            "local_gb": node.local_gb,
            "local_gb_used": node.local_gb_used,
            "free_ram_mb": node.memory_mb - node.memory_mb_used,
            "free_disk_gb": node.local_gb - node.local_gb_used,
            "running_vms": node.running_vms,
            "current_workload": 0,
            "disk_available_least": node.local_gb - node.local_gb_used,
            "cpu_info": {} if version.at_least("2.28") else "{}",
        }
    )
    return body


def with_servers(
    body: dict[str, Any], servers: Sequence[Instance], version: APIVersion
) -> dict[str, Any]:
    """``body`` with the servers on the hypervisor: below 2.75 only when it has any, from
    2.75 always (an empty list for none), so a client need not test for the key."""
    if servers or version.at_least("2.75"):
        body["servers"] = [{"name": instance_name(i), "uuid": str(i.uuid)} for i in servers]
    return body


def statistics_view(totals: NodeTotals) -> dict[str, Any]:
    """Totals over the nodes of enabled compute services, summed by the database."""
    free_disk = totals.local_gb - totals.local_gb_used
    return {
        "hypervisor_statistics": {
            "count": totals.count,
            "vcpus": totals.vcpus,
            "memory_mb": totals.memory_mb,
            "local_gb": totals.local_gb,
            "vcpus_used": totals.vcpus_used,
            "memory_mb_used": totals.memory_mb_used,
            "local_gb_used": totals.local_gb_used,
            "free_ram_mb": totals.memory_mb - totals.memory_mb_used,
            "free_disk_gb": free_disk,
            "current_workload": 0,
            "running_vms": totals.running_vms,
            "disk_available_least": free_disk,
        }
    }
