"""RamWeigher: spread instances by preferring the host with the most free RAM."""

from __future__ import annotations

from shared.db.host_candidates import FREE_RAM_MB
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec


class RamWeigher:
    """Scores a host by its usable free RAM (allocation ratio included).

    With the default positive multiplier the emptiest host wins (spread); a negative
    multiplier fills one host before the next (stack).
    """

    name = "RamWeigher"
    sql_score: str | None = FREE_RAM_MB

    def __init__(self, multiplier: float = 1.0) -> None:
        self.multiplier = multiplier

    def weigh(self, host: HostState, spec: RequestSpec) -> float:
        return host.node.free_ram_mb
