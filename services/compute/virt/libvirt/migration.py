"""Live migration between libvirtd daemons: the destination XML and the flags.

The destination's agent prepares the guest's directory (its base hard-linked from its
image cache, an empty overlay of the same size to receive the disk, config drive,
kernel) and answers its own domain XML for the guest: its paths, its domain name, its
SSH forward and metadata socket, keel's metadata naming its node and the move. The
source's driver does not send that XML as it is: libvirt wants the destination's
definition to be the running domain's (the same UUID and guest ABI, every device and
address libvirt filled in), so the source takes its own migratable XML and puts in it
what the destination's says about *where*: keel's metadata, each disk's file
(by target), the kernel and initrd, the serial log and QEMU's command-line arguments
(the user-mode network with the destination's forwards); the destination's domain name
is a parameter of its own.

The migration is *managed* (the source's agent holds a connection to both daemons; it
needs no daemon to reach another), live, with the disk's top layer copied over NBD
(``VIR_MIGRATE_NON_SHARED_INC``: the base is on both sides), the destination's domain
made persistent and left *paused* (``VIR_MIGRATE_PAUSED``): keel's switch-over resumes it.
QEMU may slow a guest that dirties its memory faster than it is copied
(``VIR_MIGRATE_AUTO_CONVERGE``, ``KEEL_LIBVIRT__MIGRATION_AUTO_CONVERGE``): without it, a
busy guest on a loaded host can keep its migration copying until keel's move deadline.
Once libvirt's copy is done the source's domain is shut off; until then it runs, and a
failed or aborted copy leaves it running there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from services.compute.virt.libvirt.domain import NAMESPACE
from services.compute.virt.libvirt.interface import QEMU_NAMESPACE

#: The file in a prepared guest directory naming the live migration it waits for.
INCOMING_MARK = ".incoming"


@dataclass(frozen=True)
class MigrationConfig:
    """This agent's side of live migration (the ``KEEL_LIBVIRT__MIGRATION_*`` settings)."""

    #: How another agent's libvirt client reaches this host's daemon.
    uri: str = "qemu:///system"
    #: Where this host's QEMU listens for a migration's streams.
    address: str = "127.0.0.1"
    #: MiB/s a migration from this host may use; 0: no limit.
    bandwidth_mib: int = 0
    #: Let QEMU slow the guest's vCPUs while its memory is dirtied faster than it is
    #: copied, so that a busy guest's migration ends instead of copying for ever.
    auto_converge: bool = True


def _replace(parent: ElementTree.Element, old: ElementTree.Element | None, new: Any) -> None:
    if old is not None:
        index = list(parent).index(old)
        parent.remove(old)
        if new is not None:
            parent.insert(index, new)
    elif new is not None:
        parent.append(new)


def destination_xml(source_xml: str, target_xml: str) -> str:
    """The source's migratable XML with the destination's names, paths and arguments."""
    ElementTree.register_namespace("qemu", QEMU_NAMESPACE)
    source = ElementTree.fromstring(source_xml)
    target = ElementTree.fromstring(target_xml)
    # The name stays the source's here: libvirt renames the domain on the destination
    # from VIR_MIGRATE_PARAM_DEST_NAME (see :func:`params`).
    # keel's metadata: the destination's node and this move.
    metadata = source.find("metadata")
    if metadata is None:
        metadata = ElementTree.SubElement(source, "metadata")
    for child in list(metadata):
        if child.tag.startswith(f"{{{NAMESPACE}}}"):
            metadata.remove(child)
    for child in target.find("metadata") or []:
        metadata.append(child)
    # Boot files.
    source_os, target_os = source.find("os"), target.find("os")
    if source_os is not None and target_os is not None:
        for tag in ("kernel", "initrd"):
            old, new = source_os.find(tag), target_os.find(tag)
            if old is not None and new is not None:
                old.text = new.text
    # Disks, by target device.
    wanted = {}
    for disk in target.iterfind("devices/disk"):
        dev, src = disk.find("target"), disk.find("source")
        if dev is not None and src is not None:
            wanted[dev.get("dev")] = src.get("file")
    for disk in source.iterfind("devices/disk"):
        dev, src = disk.find("target"), disk.find("source")
        if dev is not None and src is not None and dev.get("dev") in wanted:
            src.set("file", wanted[dev.get("dev")] or "")
    # The serial port's log.
    target_log = target.find("devices/serial/log")
    source_log = source.find("devices/serial/log")
    if target_log is not None and source_log is not None:
        source_log.set("file", target_log.get("file", ""))
    # QEMU's own arguments (the user-mode network and its forwards).
    tag = f"{{{QEMU_NAMESPACE}}}commandline"
    _replace(source, source.find(tag), target.find(tag))
    return ElementTree.tostring(source, encoding="unicode")


def disks_to_copy(xml: str) -> list[str]:
    """The writable file disks (their target devices): the read-only config drive is
    the destination's own."""
    root = ElementTree.fromstring(xml)
    found = []
    for disk in root.iterfind("devices/disk"):
        dev = disk.find("target")
        if disk.find("readonly") is None and dev is not None and dev.get("dev"):
            found.append(str(dev.get("dev")))
    return found


def flags(libvirt: Any, *, auto_converge: bool = True) -> int:
    found = (
        libvirt.VIR_MIGRATE_LIVE
        | libvirt.VIR_MIGRATE_PERSIST_DEST
        | libvirt.VIR_MIGRATE_PAUSED
        | libvirt.VIR_MIGRATE_NON_SHARED_INC
    )
    if auto_converge:
        found |= libvirt.VIR_MIGRATE_AUTO_CONVERGE
    return int(found)


def params(
    libvirt: Any, *, xml: str, name: str, address: str, bandwidth_mib: int
) -> dict[str, Any]:
    """migrate3's parameters: the memory stream to ``address`` (the destination's), where
    the destination's NBD server for the disk listens too."""
    host = f"[{address}]" if ":" in address else address
    found: dict[str, Any] = {
        libvirt.VIR_MIGRATE_PARAM_URI: f"tcp://{host}",
        libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS: address,
        libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml,
        libvirt.VIR_MIGRATE_PARAM_DEST_NAME: name,
        libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS: disks_to_copy(xml),
    }
    if bandwidth_mib:
        found[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = bandwidth_mib
    return found
