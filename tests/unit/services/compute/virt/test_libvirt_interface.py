"""A libvirt guest's network interface in its domain XML, without libvirt."""

from __future__ import annotations

import uuid
from pathlib import Path
from xml.etree import ElementTree

from services.compute.virt.libvirt.domain import GuestFiles, domain_xml
from services.compute.virt.libvirt.interface import (
    QEMU_NAMESPACE,
    GuestNic,
    NetworkConfig,
    netdev_option,
)
from shared.objects.network import FixedIp, forward_address, mac_address
from tests.unit.services.compute.standin import make_spec

NODE = uuid.UUID("1b05af30-30c0-4caa-b955-d8de5b689128")
NETWORK = uuid.UUID("5d0c1a44-2f0e-4f6b-9a51-6b65656c0001")
FIXED = FixedIp(
    network_id=NETWORK,
    network_name="private",
    address="10.0.3.7",
    mac=mac_address(NETWORK, "10.0.3.7"),
    cidr="10.0.0.0/16",
)
FILES = GuestFiles(disk=Path("/g/disk"), console_log=Path("/g/console.log"))


def _domain(nic: GuestNic) -> ElementTree.Element:
    xml = domain_xml(
        make_spec(), node_uuid=NODE, domain_type="qemu", files=FILES, made_by="build", nic=nic
    )
    return ElementTree.fromstring(xml)


def test_the_forward_is_the_address_with_127_first() -> None:
    assert forward_address("10.0.3.7") == "127.0.3.7"
    assert forward_address("192.168.1.20") == "127.168.1.20"


def test_bridge_mode_is_a_virtio_tap_on_the_bridge_with_the_ports_mac() -> None:
    root = _domain(GuestNic(NetworkConfig(mode="bridge", bridge="br-prov"), FIXED))

    interface = root.find("devices/interface")
    assert interface is not None
    assert interface.get("type") == "bridge"
    assert interface.find("source").get("bridge") == "br-prov"  # type: ignore[union-attr]
    assert interface.find("mac").get("address") == FIXED.mac  # type: ignore[union-attr]
    assert root.find(f"{{{QEMU_NAMESPACE}}}commandline") is None


def test_user_mode_offers_the_fixed_address_and_forwards_ssh_from_loopback() -> None:
    nic = GuestNic(NetworkConfig(ssh_forward_port=2222), FIXED)

    root = _domain(nic)
    args = [arg.get("value", "") for arg in root.iter(f"{{{QEMU_NAMESPACE}}}arg")]

    assert root.find("devices/interface") is None
    assert args[0] == "-netdev"
    options = dict(part.partition("=")[::2] for part in args[1].split(",")[1:])
    assert options["dhcpstart"] == "10.0.3.7"
    assert options["host"] == "10.0.0.1"
    assert options["restrict"] == "on"
    assert options["hostfwd"] == "tcp:127.0.3.7:2222-10.0.3.7:22"
    assert "guestfwd" not in options
    assert args[2] == "-device"
    assert f"mac={FIXED.mac}" in args[3]


def test_user_mode_with_a_metadata_socket_forwards_169_254_169_254_to_it() -> None:
    nic = GuestNic(NetworkConfig(), FIXED, metadata_socket=Path("/g/metadata.sock"))

    option = netdev_option(nic)

    assert "guestfwd=tcp:169.254.169.254:80-unix:/g/metadata.sock,,reconnect=1" in option
