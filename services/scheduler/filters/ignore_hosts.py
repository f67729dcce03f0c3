"""IgnoreHostsFilter: skip hosts the request says to avoid (e.g. where a build failed)."""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class IgnoreHostsFilter:
    """Passes hosts whose name is not in ``spec.ignore_hosts``."""

    name = "IgnoreHostsFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        if host.node.host in spec.ignore_hosts:
            LOG.debug("host %s: ignored by the request", host.node.host)
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        if not spec.ignore_hosts:
            return None
        return f"NOT (n.host = ANY({sql.bind(list(spec.ignore_hosts))}::text[]))"
