"""The resources an agent reports: the driver's totals plus the operator's policy.

The driver says what the hypervisor has; ``settings.compute`` says how far it may be
over-committed and which availability zone it serves. Together they make the
:class:`~shared.objects.compute_node.NodeResources` sent with registration and with
the heartbeats (when they changed, and every few beats: ``agent.RESOURCES_EVERY``), from
which the scheduler computes free capacity.
"""

from __future__ import annotations

from services.compute.virt.driver import Driver
from shared.config import ComputeSettings
from shared.objects.compute_node import NodeResources


async def node_resources(driver: Driver, compute: ComputeSettings) -> NodeResources:
    totals = await driver.resources()
    return NodeResources(
        hypervisor_hostname=driver.hypervisor_hostname(),
        vcpus=totals.vcpus,
        memory_mb=totals.memory_mb,
        local_gb=totals.local_gb,
        cpu_allocation_ratio=compute.cpu_allocation_ratio,
        ram_allocation_ratio=compute.ram_allocation_ratio,
        disk_allocation_ratio=compute.disk_allocation_ratio,
        availability_zone=compute.availability_zone,
        running_vms=totals.running_vms,
    )
