"""DiskFilter: the host has enough local disk left, counting its allocation ratio."""

from __future__ import annotations

import logging

from shared.db.host_candidates import FREE_DISK_GB, HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class DiskFilter:
    """Passes hosts where ``local_gb * disk_allocation_ratio - local_gb_used`` covers the flavor.

    The flavor needs its root disk plus its ephemeral disk, as the claim counts it.
    """

    name = "DiskFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        needed = spec.flavor.disk_gb
        free = host.node.free_disk_gb
        if free < needed:
            LOG.debug(
                "host %s: %g GB usable disk left, the flavor needs %d GB",
                host.node.host,
                free,
                needed,
            )
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return f"{FREE_DISK_GB} >= {sql.bind(float(spec.flavor.disk_gb))}::float8"
