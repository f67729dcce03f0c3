"""The protocol every scheduler filter implements.

A filter looks at one host and one request and says whether the host can take it. It
reads only the :class:`~shared.objects.compute_node.HostState` loaded for the request,
never the database, so filtering is pure and cheap. A filter that rejects a host logs
why at DEBUG; :mod:`services.scheduler.host_manager` runs the filters and logs how many
hosts each removed.

A filter also says the same thing in SQL (``sql_condition``), so that the scheduler
reads only hosts worth reading: the best few that pass every condition
(:mod:`shared.db.host_candidates`). Both forms must agree; ``host_passes`` is still run
on every host read. A filter without an SQL form returns ``None`` and is applied in
Python only (the scheduler then reads further pages while it rejects whole pages).
"""

from __future__ import annotations

from typing import Protocol

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec


class HostFilter(Protocol):
    """Decides, for one host, whether it may take the requested instance."""

    #: Shown in logs, e.g. ``RamFilter``.
    name: str

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool: ...

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        """The same test as an SQL condition over ``n``/``s``, or ``None`` if it has none."""
        ...
