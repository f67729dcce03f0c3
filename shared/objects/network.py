"""Networks and the fixed IPv4 addresses servers hold on them."""

from __future__ import annotations

import hashlib
import ipaddress
from uuid import UUID

from shared.objects.base import KeelModel


def mac_address(network_id: UUID, address: str) -> str:
    """The MAC address of ``address`` on ``network_id``: stable, and never a real vendor's.

    The first octet ``02`` marks a locally administered unicast address; the second
    comes from the network's id, the last four are the IPv4 address itself, so two
    addresses never share a MAC.
    """
    network_octet = hashlib.sha256(network_id.bytes).digest()[0]
    octets = (0x02, network_octet, *ipaddress.IPv4Address(address).packed)
    return ":".join(f"{octet:02x}" for octet in octets)


class Network(KeelModel):
    """A network keel hands addresses out of (a row of ``networks``)."""

    id: UUID
    name: str
    cidr: str


class FixedIp(KeelModel):
    """An address a server holds: what the API shows and what the agent gives the guest."""

    network_id: UUID
    network_name: str
    address: str
    mac: str
    version: int = 4
    #: The device tag the client gave the server's interface on this network, if any.
    tag: str | None = None


class PoolUsage(KeelModel):
    """How many of a network's addresses can be handed out, and how many are free."""

    network: Network
    total: int
    free: int
