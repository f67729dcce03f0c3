"""AggregateMultiTenancyIsolation: hosts set aside for some projects take only theirs.

A host whose aggregates have metadata ``filter_tenant_id`` (or keys starting with it:
``filter_tenant_id2``...), each a comma-separated list of project ids, takes only
servers of those projects; a host without such metadata takes every project's.
"""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)

KEY = "filter_tenant_id"


def allowed_projects(host: HostState) -> set[str] | None:
    """The projects the host is set aside for; ``None`` when it is open to all."""
    found: set[str] | None = None
    for key, values in host.aggregate_metadata.items():
        if key.startswith(KEY):
            found = found or set()
            for value in values:
                found |= {part.strip() for part in value.split(",") if part.strip()}
    return found


class AggregateMultiTenancyIsolation:
    name = "AggregateMultiTenancyIsolation"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        allowed = allowed_projects(host)
        if allowed is None or spec.project_id in allowed:
            return True
        LOG.debug(
            "host %s: set aside for projects %s, not %s",
            host.node.host,
            ", ".join(sorted(allowed)),
            spec.project_id,
        )
        return False

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return None
