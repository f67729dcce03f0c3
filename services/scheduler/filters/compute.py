"""ComputeFilter: the host's compute service is enabled, not forced down, and up."""

from __future__ import annotations

import logging

from shared.db.host_candidates import IS_UP, HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class ComputeFilter:
    """Passes hosts whose service can take work right now.

    ``is_up`` is computed by the host-state query on the database clock: the last
    heartbeat is within the service down time and the service is not forced down.
    """

    name = "ComputeFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        service = host.service
        if service.disabled:
            LOG.debug(
                "host %s: compute service is disabled (%s)",
                host.node.host,
                service.disabled_reason or "no reason given",
            )
            return False
        if service.forced_down:
            LOG.debug("host %s: compute service is forced down", host.node.host)
            return False
        if not service.is_up:
            LOG.debug(
                "host %s: compute service is down (last heartbeat %s)",
                host.node.host,
                service.last_seen_up,
            )
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return f"NOT s.disabled AND {IS_UP}"
