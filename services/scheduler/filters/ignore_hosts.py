"""IgnoreHostsFilter: skip hosts the request says to avoid (e.g. where a build failed)."""

from __future__ import annotations

import logging

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
