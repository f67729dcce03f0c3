"""AvailabilityZoneFilter: the host is in the availability zone the request names."""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class AvailabilityZoneFilter:
    """Passes every host when the request names no zone, else the hosts in that zone."""

    name = "AvailabilityZoneFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        wanted = spec.availability_zone
        if wanted and host.node.availability_zone != wanted:
            LOG.debug(
                "host %s: in availability zone %s, the request asks for %s",
                host.node.host,
                host.node.availability_zone,
                wanted,
            )
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        if not spec.availability_zone:
            return None
        return f"n.availability_zone = {sql.bind(spec.availability_zone)}::text"
