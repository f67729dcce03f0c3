"""VcpuFilter: the host has enough virtual CPUs left, counting its allocation ratio."""

from __future__ import annotations

import logging

from shared.db.host_candidates import FREE_VCPUS, HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class VcpuFilter:
    """Passes hosts where ``vcpus * cpu_allocation_ratio - vcpus_used`` covers the flavor."""

    name = "VcpuFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        free = host.node.free_vcpus
        if free < spec.flavor.vcpus:
            LOG.debug(
                "host %s: %g usable vCPUs left, the flavor needs %d",
                host.node.host,
                free,
                spec.flavor.vcpus,
            )
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return f"{FREE_VCPUS} >= {sql.bind(float(spec.flavor.vcpus))}::float8"
