"""RequestedDestinationFilter: only the compute nodes an admin asked the server to go to.

keel-api resolves ``host`` and/or ``hypervisor_hostname`` (microversion 2.74), or the
forced ``zone:host[:node]`` form, to compute node ids before the request is accepted;
the request then carries them as ``spec.requested_destination``. This filter narrows
the candidates to those nodes. The other filters still run, so a disabled, down or full
requested host ends in "No valid host" — unless the destination is forced, in which
case :class:`~services.scheduler.host_manager.HostManager` runs this filter alone (the
claim that follows still refuses a host without room).
"""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)


class RequestedDestinationFilter:
    """Passes every node when the request names no destination, else only its nodes."""

    name = "RequestedDestinationFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        wanted = spec.requested_destination
        if wanted is None or host.node.id in wanted.node_ids:
            return True
        LOG.debug(
            "node %s (host %s): not the requested destination (%s)",
            host.node.hypervisor_hostname,
            host.node.host,
            wanted.describe(),
        )
        return False

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        wanted = spec.requested_destination
        if wanted is None:
            return None
        return f"n.id = ANY({sql.bind(list(wanted.node_ids))}::bigint[])"
