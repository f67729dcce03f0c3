"""Diagnostics of a guest whose hypervisor is simulated (the local and fake drivers).

What such a driver knows of a guest is its spec and its power state: its vCPUs and
memory from its flavor, one NIC per address (with the address's MAC), one disk, and how
long it has run since its last boot. Counters it cannot know (CPU time, bytes moved) are
``None``, as Nova shows what a driver does not report. ``driver`` is ``libvirt``: the
compute API names only real hypervisor drivers there (Nova's own fake driver reports
the same); ``hypervisor`` says which simulated driver it is.
"""

from __future__ import annotations

from services.compute.rpcapi import (
    CpuDiagnostics,
    DiskDiagnostics,
    GuestDiagnostics,
    InstanceSpec,
    MemoryDiagnostics,
    NicDiagnostics,
)

#: The driver family the API shows for the simulated drivers.
SIMULATED_DRIVER = "libvirt"


def simulated(
    spec: InstanceSpec, *, state: str, hypervisor: str, uptime: int | None
) -> GuestDiagnostics:
    running = state == "running"
    flavor = spec.flavor
    return GuestDiagnostics(
        state=state,
        driver=SIMULATED_DRIVER,
        hypervisor=hypervisor,
        hypervisor_os="linux",
        uptime=uptime if running else None,
        cpu_details=[CpuDiagnostics(id=index) for index in range(flavor.vcpus)],
        nic_details=[NicDiagnostics(mac_address=address.mac) for address in spec.addresses],
        disk_details=[DiskDiagnostics()],
        memory_details=MemoryDiagnostics(
            maximum=flavor.memory_mb, used=flavor.memory_mb if running else 0
        ),
    )
