"""ServerGroupSoftWeigher: the soft policies of server groups (Nova's
ServerGroupSoftAffinityWeigher and ServerGroupSoftAntiAffinityWeigher in one).

A host scores the number of the group's other members it holds: with ``soft-affinity``
the most is best (pack), with ``soft-anti-affinity`` the fewest (spread). Hosts are only
ordered, never refused: when the preferred host is full, another one is used.
"""

from __future__ import annotations

from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec
from shared.objects.server_group import SOFT_AFFINITY, SOFT_ANTI_AFFINITY


class ServerGroupSoftWeigher:
    name = "ServerGroupSoftWeigher"
    sql_score: str | None = None

    def __init__(self, multiplier: float = 1.0) -> None:
        self.multiplier = multiplier

    def weigh(self, host: HostState, spec: RequestSpec) -> float:
        group = spec.group
        if group is None:
            return 0.0
        held = float(group.members_on(host.service.id))
        if group.policy == SOFT_AFFINITY:
            return held
        if group.policy == SOFT_ANTI_AFFINITY:
            return -held
        return 0.0
