"""The protocol every scheduler filter implements.

A filter looks at one host and one request and says whether the host can take it. It
reads only the :class:`~shared.objects.compute_node.HostState` loaded for the request
(one query for every host), never the database, so filtering is pure and cheap. A
filter that rejects a host logs why at DEBUG; :mod:`services.scheduler.host_manager`
runs the filters and logs how many hosts each removed.
"""

from __future__ import annotations

from typing import Protocol

from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec


class HostFilter(Protocol):
    """Decides, for one host, whether it may take the requested instance."""

    #: Shown in logs, e.g. ``RamFilter``.
    name: str

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool: ...
