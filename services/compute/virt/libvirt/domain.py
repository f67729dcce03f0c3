"""libvirt domain XML for keel guests, and keel's metadata in it.

Several agents may share one libvirtd (in tests; a host running two nodes), and during
an evacuation or migration between two such agents one server has a domain on each.
So a domain is named and identified by the node *and* the server: its libvirt UUID is
derived from both, its name is ``keel-<node prefix>-<server uuid>``, and keel's metadata
element records the server, the node and the build or move that made it. The server's
UUID is the guest's SMBIOS serial number, as Nova sets it: what the guest can read of
its identity; its SMBIOS product is ``OpenStack Compute``, by which cloud-init knows it
runs on an OpenStack cloud.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID
from xml.etree import ElementTree

from services.compute.rpcapi import InstanceSpec
from services.compute.virt.libvirt.interface import GuestNic, add_interface

#: The namespace of keel's element in a domain's ``<metadata>``.
NAMESPACE = "https://keel.invalid/xmlns/libvirt/instance/1"
#: The kernel command line when the image sets none: the console on the first serial
#: port, which is logged to the guest's console log.
DEFAULT_KERNEL_ARGS = "console=ttyS0"


def domain_uuid(node_uuid: UUID, instance_uuid: UUID) -> UUID:
    """The libvirt UUID of ``instance_uuid``'s domain on node ``node_uuid``."""
    return uuid.uuid5(node_uuid, str(instance_uuid))


def name_prefix(node_uuid: UUID) -> str:
    return f"keel-{node_uuid.hex[:8]}-"


def domain_name(node_uuid: UUID, instance_uuid: UUID) -> str:
    return f"{name_prefix(node_uuid)}{instance_uuid}"


@dataclass(frozen=True)
class GuestFiles:
    """Where a guest's files are (all inside its own directory)."""

    disk: Path
    console_log: Path
    kernel: Path | None = None
    ramdisk: Path | None = None
    #: The config drive (an ISO 9660 image labelled ``config-2``), when the guest has one.
    config_drive: Path | None = None


@dataclass(frozen=True)
class Metadata:
    instance_uuid: UUID
    node_uuid: UUID
    made_by: str


def metadata_element(meta: Metadata, display_name: str) -> ElementTree.Element:
    """keel's metadata element (namespaced), for a domain's ``<metadata>``."""
    root = ElementTree.Element(f"{{{NAMESPACE}}}instance")
    for tag, text in (
        ("uuid", str(meta.instance_uuid)),
        ("node", str(meta.node_uuid)),
        ("name", display_name),
        ("made-by", meta.made_by),
    ):
        ElementTree.SubElement(root, f"{{{NAMESPACE}}}{tag}").text = text
    return root


def parse_metadata(text: str) -> Metadata | None:
    """keel's metadata read back from libvirt; ``None`` if it is not keel's or broken."""
    try:
        root = ElementTree.fromstring(text)
        found = {child.tag.rpartition("}")[2]: (child.text or "") for child in root}
        return Metadata(
            instance_uuid=UUID(found["uuid"]),
            node_uuid=UUID(found["node"]),
            made_by=found.get("made-by", ""),
        )
    except (ElementTree.ParseError, KeyError, ValueError):
        return None


def _sub(
    parent: ElementTree.Element, tag: str, text: str | None = None, **attrs: str
) -> ElementTree.Element:
    element = ElementTree.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


def domain_xml(
    spec: InstanceSpec,
    *,
    node_uuid: UUID,
    domain_type: str,
    files: GuestFiles,
    made_by: str,
    kernel_args: str | None = None,
    nic: GuestNic | None = None,
) -> str:
    """The persistent definition of ``spec``'s guest on this node."""
    flavor = spec.flavor
    domain = ElementTree.Element("domain", {"type": domain_type})
    _sub(domain, "name", domain_name(node_uuid, spec.uuid))
    _sub(domain, "uuid", str(domain_uuid(node_uuid, spec.uuid)))
    _sub(domain, "title", spec.display_name)
    metadata = _sub(domain, "metadata")
    metadata.append(metadata_element(Metadata(spec.uuid, node_uuid, made_by), spec.display_name))
    _sub(domain, "memory", str(flavor.memory_mb), unit="MiB")
    _sub(domain, "vcpu", str(flavor.vcpus))
    sysinfo = _sub(domain, "sysinfo", type="smbios")
    system = _sub(sysinfo, "system")
    _sub(system, "entry", "keel", name="manufacturer")
    # cloud-init recognises an OpenStack guest by this product name (Nova's generic one),
    # and only then asks the metadata service.
    _sub(system, "entry", "OpenStack Compute", name="product")
    _sub(system, "entry", str(spec.uuid), name="serial")
    os_ = _sub(domain, "os")
    _sub(os_, "type", "hvm", arch="x86_64")
    if files.kernel is not None:
        _sub(os_, "kernel", str(files.kernel))
        if files.ramdisk is not None:
            _sub(os_, "initrd", str(files.ramdisk))
        _sub(os_, "cmdline", kernel_args or DEFAULT_KERNEL_ARGS)
    else:
        _sub(os_, "boot", dev="hd")
    _sub(os_, "smbios", mode="sysinfo")
    features = _sub(domain, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    _sub(domain, "on_poweroff", "destroy")
    _sub(domain, "on_reboot", "restart")
    _sub(domain, "on_crash", "destroy")
    devices = _sub(domain, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", cache="none")
    _sub(disk, "source", file=str(files.disk))
    _sub(disk, "target", dev="vda", bus="virtio")
    if files.config_drive is not None:
        drive = _sub(devices, "disk", type="file", device="disk")
        _sub(drive, "driver", name="qemu", type="raw")
        _sub(drive, "source", file=str(files.config_drive))
        _sub(drive, "target", dev="vdb", bus="virtio")
        _sub(drive, "readonly")
    if nic is not None:
        add_interface(domain, devices, nic)
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "log", file=str(files.console_log), append="on")
    _sub(serial, "target", port="0")
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port="0")
    _sub(devices, "memballoon", model="none")
    return ElementTree.tostring(domain, encoding="unicode")
