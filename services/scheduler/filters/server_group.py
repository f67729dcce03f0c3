"""ServerGroupFilter: the hard policy of the instance's server group (Nova's
ServerGroupAffinityFilter and ServerGroupAntiAffinityFilter in one).

``spec.group`` is read by the scheduler under the group's lock, in the transaction that
then claims (:func:`shared.db.server_groups.placement`), so the hosts this filter lets
through are still right when the claim commits: two members of an anti-affinity group
placed at once never land on one host. A host is a compute service: its nodes count
together. The soft policies never remove a host (see
:mod:`services.scheduler.weighers.server_group`).
"""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec
from shared.objects.server_group import AFFINITY, ANTI_AFFINITY

LOG = logging.getLogger(__name__)


class ServerGroupFilter:
    """Passes every host when the instance is in no group with a hard policy."""

    name = "ServerGroupFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        group = spec.group
        if group is None or group.allows(host.service.id):
            return True
        LOG.debug("host %s: %s", host.node.host, group.refusal(host.node.host, host.service.id))
        return False

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        group = spec.group
        if group is None:
            return None
        if group.policy == AFFINITY and group.members_by_service:
            return f"s.id = ANY({sql.bind(sorted(group.members_by_service))}::bigint[])"
        if group.policy == ANTI_AFFINITY:
            full = sorted(
                service for service in group.members_by_service if not group.allows(service)
            )
            if full:
                return f"NOT (s.id = ANY({sql.bind(full)}::bigint[]))"
        return None
