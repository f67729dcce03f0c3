"""Where an admin asks a new server to go, and the zone it is created in.

Two ways to name a destination on ``POST /servers``:

* ``host`` and/or ``hypervisor_hostname`` (microversion 2.74, policy
  ``compute:servers:create:requested_destination``): the scheduler narrows its
  candidates to that host's nodes and still runs every filter, so a disabled, down or
  full host ends in "No valid host";
* the older forced form, ``availability_zone="zone:host"``, ``"zone:host:node"`` or
  ``"zone::node"`` (policy ``os_compute_api:servers:create:forced_host``): the filters
  are skipped; the claim is still atomic, so a full host is never over-committed.

The two are mutually exclusive. Names are resolved here, once, to compute node ids
(a name that matches no live node is a 400 and no server row is written); from then
on the request follows ids. The destination travels with the build only: it is never
stored with the request spec, so later moves choose freely.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.api.http.faults import BadRequest
from services.api.http.microversion import APIVersion
from services.api.http.policy import FORCED_HOST, REQUESTED_DESTINATION, Policy
from shared.context import RequestContext
from shared.db import compute_nodes
from shared.db.pool import Connection
from shared.objects.instance import RequestedDestination

#: The microversion that accepts ``host`` and ``hypervisor_hostname`` on create.
DESTINATION_MICROVERSION = "2.74"


@dataclass(frozen=True)
class ZoneRequest:
    """``availability_zone`` as given: a zone, and the forced host and/or node it names."""

    zone: str | None
    host: str | None = None
    node: str | None = None

    @property
    def forced(self) -> bool:
        return self.host is not None or self.node is not None


def parse_zone(value: str | None) -> ZoneRequest:
    """``zone``, ``zone:host``, ``zone:host:node`` or ``zone::node``; empty parts are unset."""
    if value is None:
        return ZoneRequest(zone=None)
    parts = value.split(":")
    if len(parts) > 3:
        raise BadRequest(
            f"Invalid availability_zone {value!r}: expected zone, zone:host, "
            "zone:host:node or zone::node."
        )
    zone, host, node = [*parts, "", ""][:3]
    return ZoneRequest(zone=zone or None, host=host or None, node=node or None)


def _not_found(host: str | None, node: str | None) -> BadRequest:
    if host is not None and node is not None:
        return BadRequest(
            f"Compute host {host} with hypervisor hostname {node} could not be found."
        )
    if host is not None:
        return BadRequest(f"Compute host {host} could not be found.")
    return BadRequest(f"Compute host with hypervisor hostname {node} could not be found.")


async def _node_ids(conn: Connection, host: str | None, node: str | None) -> list[int]:
    nodes = await compute_nodes.named(conn, host=host, node=node)
    if not nodes:
        raise _not_found(host, node)
    return [n.id for n in nodes]


async def resolve(
    conn: Connection,
    ctx: RequestContext,
    policy: Policy,
    version: APIVersion,
    *,
    host: str | None,
    node: str | None,
    zone: ZoneRequest,
) -> RequestedDestination | None:
    """The destination a create request names, checked and resolved to node ids; None
    when it names none. Raises the API's 400 and 403 faults."""
    requested = host is not None or node is not None
    if requested and not version.at_least(DESTINATION_MICROVERSION):
        fields = ", ".join(repr(f) for f, v in (("host", host), ("hypervisor_hostname", node)) if v)
        raise BadRequest(
            "Invalid input for field/attribute server. Additional properties are not allowed "
            f"({fields} unexpected) before microversion {DESTINATION_MICROVERSION}."
        )
    if requested:
        policy.enforce(REQUESTED_DESTINATION, ctx)
        if zone.forced:
            raise BadRequest(
                "host and hypervisor_hostname cannot be combined with a host or node in "
                "availability_zone (zone:host[:node]): they are mutually exclusive."
            )
        return RequestedDestination(
            host=host, node=node, node_ids=await _node_ids(conn, host, node)
        )
    if zone.forced:
        policy.enforce(FORCED_HOST, ctx)
        return RequestedDestination(
            host=zone.host,
            node=zone.node,
            node_ids=await _node_ids(conn, zone.host, zone.node),
            forced=True,
        )
    return None
