"""IgnoreHostsFilter: skip the compute nodes a request says to avoid.

Nodes are named by UUID (``spec.ignore_nodes``), so a renamed host is still recognised.
Request specs written by an older release may name hosts instead (``ignore_hosts``);
those names are still honoured, and each such match is logged.
"""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class IgnoreHostsFilter:
    """Passes nodes not in ``spec.ignore_nodes`` (nor, by name, in ``spec.ignore_hosts``)."""

    name = "IgnoreHostsFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        if host.node.uuid in spec.ignore_nodes:
            LOG.debug("node %s (host %s): ignored by the request", host.node.uuid, host.node.host)
            return False
        if host.service.host in spec.ignore_hosts:
            LOG.info(
                "host %s: ignored by name, as a request spec of an older release asks",
                host.service.host,
                extra={"instance_uuid": str(spec.instance_uuid)},
            )
            return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        conditions = []
        if spec.ignore_nodes:
            conditions.append(f"NOT (n.uuid = ANY({sql.bind(list(spec.ignore_nodes))}::uuid[]))")
        if spec.ignore_hosts:
            conditions.append(f"NOT (n.host = ANY({sql.bind(list(spec.ignore_hosts))}::text[]))")
        return " AND ".join(conditions) or None
