"""RamFilter: the host has enough memory left, counting its allocation ratio."""

from __future__ import annotations

import logging

from shared.db.host_candidates import FREE_RAM_MB, HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class RamFilter:
    """Passes hosts where ``memory_mb * ram_allocation_ratio - memory_mb_used`` fits the flavor."""

    name = "RamFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        free = host.node.free_ram_mb
        if free < spec.flavor.memory_mb:
            LOG.debug(
                "host %s: %g MB usable RAM left, the flavor needs %d MB",
                host.node.host,
                free,
                spec.flavor.memory_mb,
            )
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return f"{FREE_RAM_MB} >= {sql.bind(float(spec.flavor.memory_mb))}::float8"
