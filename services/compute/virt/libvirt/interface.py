"""A guest's network interface: QEMU user-mode networking, or a tap on a Linux bridge.

Every guest gets one virtio NIC with the MAC address and fixed IPv4 address keel-api
gave it (the first IPv4 address of its spec), in one of two modes
(``KEEL_LIBVIRT__NETWORK``):

* ``bridge`` — a tap on the operator's Linux bridge (``KEEL_LIBVIRT__BRIDGE``), a
  provider network: libvirt plugs it in. The guest configures its address from its
  config drive or from the network's DHCP.
* ``user`` — QEMU's user-mode network stack (slirp), a private network of the guest's
  own that needs no bridge and no privileges. Its DHCP server offers the guest exactly
  its fixed address; ``restrict=on`` lets nothing out, and only two doors in:

  - the guest's port 22 forwarded from its own loopback address on the host
    (:func:`~shared.objects.network.forward_address`, port
    ``KEEL_LIBVIRT__SSH_FORWARD_PORT``);
  - with a metadata socket, the guest's connections to ``169.254.169.254:80`` forwarded
    to that Unix socket on the host (QEMU reconnects to it within a second when the
    agent that serves it restarts).

  slirp forwards a guest's connections only to addresses inside its network, and the
  guest's address and 169.254.169.254 share no prefix, so the slirp network is the
  whole IPv4 space (``net=0.0.0.0/0.0.0.0``) with the guest's gateway as slirp's host
  address: the guest still sees only its address, its gateway and the metadata address
  (slirp answers ARP for nothing else), and reaches nothing but the two doors.

libvirt (9.0) cannot say forwards of a user-mode interface, so that one is given to QEMU
in the domain's ``<qemu:commandline>``; everything about it is in this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from xml.etree import ElementTree

from services.compute.rpcapi import InstanceSpec
from shared.objects.network import FixedIp, forward_address

#: libvirt's namespace for QEMU command-line pass-through.
QEMU_NAMESPACE = "http://libvirt.org/schemas/domain/qemu/1.0"
#: Where guests find the metadata service, as on every OpenStack cloud.
METADATA_ADDRESS = "169.254.169.254"
METADATA_PORT = 80
#: QEMU's id of the user-mode network (libvirt's own devices are named ``net0``...).
NETDEV_ID = "keelnet0"
#: The NIC's PCI slot: libvirt hands out the low slots to the devices it knows, and QEMU
#: would otherwise give this one the first free slot before libvirt's take theirs.
PCI_SLOT = "0x1e"
#: slirp's DNS address must differ from its host and DHCP addresses; nothing answers
#: there (a restricted network resolves nothing).
_SLIRP_DNS = "169.254.169.253"

Mode = Literal["user", "bridge"]


@dataclass(frozen=True)
class NetworkConfig:
    """How this agent connects guests (the ``KEEL_LIBVIRT__`` network settings)."""

    mode: Mode = "user"
    bridge: str | None = None
    ssh_forward_port: int = 22


@dataclass(frozen=True)
class GuestNic:
    """One guest's interface: its address, and in user mode its two doors."""

    config: NetworkConfig
    fixed: FixedIp
    metadata_socket: Path | None = None

    @property
    def ssh_forward(self) -> tuple[str, int]:
        return forward_address(self.fixed.address), self.config.ssh_forward_port

    @property
    def gateway(self) -> str:
        """The network's first host; without its range, the first host of the /24."""
        gateway = self.fixed.gateway()
        if gateway is not None:
            return gateway
        return self.fixed.address.rsplit(".", 1)[0] + ".1"


def primary_address(spec: InstanceSpec) -> FixedIp | None:
    """The address the guest's interface gets: its first IPv4 one."""
    return next((fixed for fixed in spec.addresses if fixed.version == 4), None)


def netdev_option(nic: GuestNic) -> str:
    """QEMU's ``-netdev user,...`` option for ``nic`` (user mode)."""
    address = nic.fixed.address
    host, port = nic.ssh_forward
    parts = [
        f"user,id={NETDEV_ID}",
        "net=0.0.0.0/0.0.0.0",
        f"host={nic.gateway}",
        f"dhcpstart={address}",
        f"dns={_SLIRP_DNS}",
        "restrict=on",
        "ipv6=off",
        f"hostfwd=tcp:{host}:{port}-{address}:22",
    ]
    if nic.metadata_socket is not None:
        # ",," is a comma inside an option's value: the chardev's own option.
        parts.append(
            f"guestfwd=tcp:{METADATA_ADDRESS}:{METADATA_PORT}-"
            f"unix:{nic.metadata_socket},,reconnect=1"
        )
    return ",".join(parts)


def add_interface(domain: ElementTree.Element, devices: ElementTree.Element, nic: GuestNic) -> None:
    """Give the domain ``nic``: an ``<interface>`` (bridge) or QEMU arguments (user)."""
    if nic.config.mode == "bridge":
        interface = ElementTree.SubElement(devices, "interface", {"type": "bridge"})
        ElementTree.SubElement(interface, "mac", {"address": nic.fixed.mac})
        ElementTree.SubElement(interface, "source", {"bridge": nic.config.bridge or ""})
        ElementTree.SubElement(interface, "model", {"type": "virtio"})
        return
    device = (
        f"virtio-net-pci,netdev={NETDEV_ID},mac={nic.fixed.mac},bus=pci.0,addr={PCI_SLOT},romfile="
    )
    commandline = ElementTree.SubElement(domain, f"{{{QEMU_NAMESPACE}}}commandline")
    for value in ("-netdev", netdev_option(nic), "-device", device):
        ElementTree.SubElement(commandline, f"{{{QEMU_NAMESPACE}}}arg", {"value": value})
