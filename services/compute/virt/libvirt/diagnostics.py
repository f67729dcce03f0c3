"""A libvirt domain's diagnostics, read from libvirt (``virDomainGetInfo``, per-vCPU times
and the root disk's block statistics), in the compute API's 2.48 shape.

Runs in the connection's thread (``conn.run``); statistics libvirt cannot give for a
stopped domain are ``None``.
"""

from __future__ import annotations

from typing import Any

from services.compute.rpcapi import (
    CpuDiagnostics,
    DiskDiagnostics,
    GuestDiagnostics,
    MemoryDiagnostics,
)

_STATES = {1: "running", 2: "running", 3: "paused", 4: "shutdown", 5: "shutdown", 6: "crashed",
           7: "suspended"}  # fmt: skip
#: The disk keel's domains boot from.
ROOT_DISK = "vda"


def _cpus(dom: Any, count: int) -> list[CpuDiagnostics]:
    try:
        info, _ = dom.vcpus()
    except Exception:  # a stopped domain has no vCPUs to read
        return [CpuDiagnostics(id=index) for index in range(count)]
    return [CpuDiagnostics(id=vcpu[0], time=vcpu[2]) for vcpu in info]


def _disk(dom: Any) -> DiskDiagnostics:
    try:
        reads, read_bytes, writes, write_bytes, errors = dom.blockStats(ROOT_DISK)
    except Exception:  # no statistics for a stopped domain
        return DiskDiagnostics()
    return DiskDiagnostics(
        read_bytes=read_bytes,
        read_requests=reads,
        write_bytes=write_bytes,
        write_requests=writes,
        errors_count=errors if errors >= 0 else None,
    )


def domain_diagnostics(dom: Any, *, saved: bool, uptime: int | None) -> GuestDiagnostics:
    """``saved``: the domain has a managed save image (a suspended guest)."""
    state_code, max_kib, used_kib, vcpus, _cpu_time = dom.info()
    state = "suspended" if saved and not dom.isActive() else _STATES.get(state_code, "pending")
    running = state == "running"
    return GuestDiagnostics(
        state=state,
        driver="libvirt",
        hypervisor="qemu",
        hypervisor_os="linux",
        uptime=uptime if running else None,
        cpu_details=_cpus(dom, vcpus),
        disk_details=[_disk(dom)],
        memory_details=MemoryDiagnostics(
            maximum=max_kib // 1024, used=used_kib // 1024 if running else 0
        ),
    )
