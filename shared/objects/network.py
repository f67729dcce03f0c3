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


def forward_address(address: str) -> str:
    """The loopback address a guest's SSH is forwarded from in user-mode networking.

    The guest's own address with its first octet made 127: stable across reboots and
    moves, different for every address of a network up to a /8, and on the loopback
    interface, which every Linux host answers for whole (``127.0.0.0/8``).
    """
    octets = ipaddress.IPv4Address(address).packed
    return str(ipaddress.IPv4Address(bytes((127, *octets[1:]))))


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
    #: The network's range (its prefix length and gateway, the first host, are what a
    #: guest configures); unset in specs from releases before it was sent.
    cidr: str | None = None

    def interface(self) -> ipaddress.IPv4Interface | None:
        """The address with its network's prefix; ``None`` when the range is not known."""
        if self.cidr is None:
            return None
        return ipaddress.IPv4Interface(
            f"{self.address}/{ipaddress.IPv4Network(self.cidr).prefixlen}"
        )

    def gateway(self) -> str | None:
        if self.cidr is None:
            return None
        return str(ipaddress.IPv4Network(self.cidr).network_address + 1)


class PoolUsage(KeelModel):
    """How many of a network's addresses can be handed out, and how many are free."""

    network: Network
    total: int
    free: int
