"""A row of ``server_groups``, and what the scheduler knows of a group while it places one
of its members.

A group's *policy* says where its members may run relative to each other, host by host
(a host is a compute service: its nodes count together):

* ``affinity`` — all on one host;
* ``anti-affinity`` — never more than ``max_server_per_host`` (1 unless the 2.64 rule
  says otherwise) on one host;
* ``soft-affinity`` / ``soft-anti-affinity`` — preferred, never refused: the scheduler
  weighs hosts by how many members they hold.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from shared.objects.base import KeelModel

AFFINITY = "affinity"
ANTI_AFFINITY = "anti-affinity"
SOFT_AFFINITY = "soft-affinity"
SOFT_ANTI_AFFINITY = "soft-anti-affinity"
POLICIES = (AFFINITY, ANTI_AFFINITY, SOFT_AFFINITY, SOFT_ANTI_AFFINITY)
#: The policies the scheduler enforces (the soft ones only weigh).
HARD_POLICIES = (AFFINITY, ANTI_AFFINITY)
MAX_SERVER_PER_HOST = "max_server_per_host"


class ServerGroup(KeelModel):
    id: int
    uuid: UUID
    name: str
    project_id: str
    user_id: str
    policy: str
    rules: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    #: The live servers in the group, oldest member first.
    members: list[UUID] = Field(default_factory=list)

    @property
    def max_server_per_host(self) -> int:
        value = self.rules.get(MAX_SERVER_PER_HOST, 1)
        return value if isinstance(value, int) and value >= 1 else 1


class GroupPlacement(KeelModel):
    """Where one group's members hold claims, read by the scheduler for one request.

    Read under the group's lock, in the transaction that then claims, so the answer
    holds until the claim is committed. The member being placed is left out: a move
    of it never counts against itself.
    """

    uuid: UUID
    name: str
    policy: str
    max_server_per_host: int = 1
    #: Compute service id → the other members holding a claim on one of its nodes.
    members_by_service: dict[int, list[UUID]] = Field(default_factory=dict)
    #: Compute service id → its host name, for messages.
    hosts: dict[int, str] = Field(default_factory=dict)

    def members_on(self, service_id: int) -> int:
        return len(self.members_by_service.get(service_id, ()))

    def allows(self, service_id: int) -> bool:
        """Whether the hard policy lets this member go to the host of ``service_id``."""
        if self.policy == AFFINITY:
            return not self.members_by_service or service_id in self.members_by_service
        if self.policy == ANTI_AFFINITY:
            return self.members_on(service_id) < self.max_server_per_host
        return True

    def refusal(self, host: str, service_id: int) -> str:
        """Why the policy refuses ``host`` (empty if it does not)."""
        if self.allows(service_id):
            return ""
        here = ", ".join(str(m) for m in self.members_by_service.get(service_id, ()))
        if self.policy == ANTI_AFFINITY:
            return (
                f"the anti-affinity policy of server group {self.name} ({self.uuid}) allows "
                f"{self.max_server_per_host} member(s) per host, and host {host} holds "
                f"{self.members_on(service_id)} ({here})"
            )
        where = ", ".join(sorted(self.hosts[s] for s in self.members_by_service))
        return (
            f"the affinity policy of server group {self.name} ({self.uuid}) keeps its "
            f"members on host {where}, not {host}"
        )

    def describe(self) -> str:
        """Where the members are, for a "no valid host" message."""
        if not self.members_by_service:
            return f"server group {self.name} ({self.uuid}, {self.policy}) has no member placed"
        held = "; ".join(
            f"{self.hosts.get(service, str(service))}: "
            + ", ".join(str(member) for member in members)
            for service, members in sorted(
                self.members_by_service.items(), key=lambda item: self.hosts.get(item[0], "")
            )
        )
        limit = (
            f", at most {self.max_server_per_host} per host" if self.policy == ANTI_AFFINITY else ""
        )
        return f"server group {self.name} ({self.uuid}) is {self.policy}{limit}; members on {held}"
