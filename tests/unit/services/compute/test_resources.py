"""The reported resources: the driver's totals with the operator's ratios and zone."""

from __future__ import annotations

from services.compute.resources import node_resources
from services.compute.virt.fake import FakeDriver
from shared.config import ComputeSettings
from tests.unit.services.compute.standin import make_spec


async def test_totals_come_from_the_driver_and_policy_from_the_settings() -> None:
    driver = FakeDriver("node-7", vcpus=16, memory_mb=65536, local_gb=900)
    await driver.spawn(make_spec())
    compute = ComputeSettings(
        cpu_allocation_ratio=8.0,
        ram_allocation_ratio=1.5,
        disk_allocation_ratio=2.0,
        availability_zone="az-east",
    )

    resources = await node_resources(driver, compute)

    assert resources.hypervisor_hostname == "node-7"
    assert (resources.vcpus, resources.memory_mb, resources.local_gb) == (16, 65536, 900)
    assert resources.cpu_allocation_ratio == 8.0
    assert resources.ram_allocation_ratio == 1.5
    assert resources.disk_allocation_ratio == 2.0
    assert resources.availability_zone == "az-east"
    assert resources.running_vms == 1
