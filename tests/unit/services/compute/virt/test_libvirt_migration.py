"""The destination XML of a libvirt live migration, without libvirt."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

from services.compute.virt.libvirt.domain import (
    NAMESPACE,
    GuestFiles,
    domain_xml,
    parse_metadata,
)
from services.compute.virt.libvirt.interface import (
    QEMU_NAMESPACE,
    GuestNic,
    NetworkConfig,
    primary_address,
)
from services.compute.virt.libvirt.migration import destination_xml, disks_to_copy, flags
from shared.objects.network import FixedIp
from tests.unit.services.compute.standin import make_spec

SOURCE_NODE = uuid.UUID("1b05af30-30c0-4caa-b955-d8de5b689128")
DEST_NODE = uuid.UUID("9c8a5e0e-6f4c-4b55-a1d2-3d6d7f1f2a10")


def _files(root: str) -> GuestFiles:
    guest = Path(root)
    return GuestFiles(
        disk=guest / "disk",
        console_log=guest / "console.log",
        kernel=guest / "kernel",
        ramdisk=guest / "ramdisk",
        config_drive=guest / "disk.config",
    )


def _xml(node: uuid.UUID, root: str, made_by: str, port: int) -> str:
    spec = make_spec()
    fixed = FixedIp(
        network_id=uuid.uuid4(), network_name="private", address="10.0.0.5",
        mac="02:00:0a:00:00:05", cidr="10.0.0.0/24",
    )  # fmt: skip
    spec = spec.model_copy(update={"uuid": SERVER, "addresses": [fixed]})
    address = primary_address(spec)
    assert address is not None
    nic = GuestNic(NetworkConfig(ssh_forward_port=port), address)
    return domain_xml(
        spec, node_uuid=node, domain_type="qemu", files=_files(root), made_by=made_by, nic=nic
    )


SERVER = uuid.UUID("3f7c3d52-1c9a-4a8e-9d1b-1c3a2b4c5d6e")


def test_the_source_definition_gets_the_destination_paths_metadata_and_forwards() -> None:
    migration = uuid.uuid4()
    source = _xml(SOURCE_NODE, "/a/instances/x", "build", 2201)
    target = _xml(DEST_NODE, "/b/instances/x", str(migration), 2202)

    merged = ElementTree.fromstring(destination_xml(source, target))

    text = ElementTree.tostring(merged, encoding="unicode")
    assert "/a/instances" not in text
    # Same identity and name as the source (libvirt renames it from a parameter).
    src_root = ElementTree.fromstring(source)
    assert merged.findtext("uuid") == src_root.findtext("uuid")
    assert merged.findtext("name") == src_root.findtext("name")
    meta = merged.find(f"metadata/{{{NAMESPACE}}}instance")
    assert meta is not None
    parsed = parse_metadata(ElementTree.tostring(meta, encoding="unicode"))
    assert parsed is not None
    assert (parsed.node_uuid, parsed.made_by) == (DEST_NODE, str(migration))
    assert merged.findtext("os/kernel") == "/b/instances/x/kernel"
    sources = [d.find("source").get("file") for d in merged.iterfind("devices/disk")]  # type: ignore[union-attr]
    assert sources == ["/b/instances/x/disk", "/b/instances/x/disk.config"]
    assert merged.find("devices/serial/log").get("file") == "/b/instances/x/console.log"  # type: ignore[union-attr]
    args = [a.get("value") for a in merged.iter(f"{{{QEMU_NAMESPACE}}}arg")]
    assert any("2202" in (a or "") for a in args)
    assert not any("2201" in (a or "") for a in args)


def test_only_the_writable_disk_is_copied() -> None:
    assert disks_to_copy(_xml(SOURCE_NODE, "/a/x", "build", 22)) == ["vda"]


def test_a_migration_may_slow_a_busy_guest_unless_told_not_to() -> None:
    """Live, persistent on the destination, left paused there, the disk's top layer
    copied; auto-converge unless the setting turns it off."""
    bits = SimpleNamespace(
        VIR_MIGRATE_LIVE=1,
        VIR_MIGRATE_PERSIST_DEST=8,
        VIR_MIGRATE_PAUSED=32,
        VIR_MIGRATE_NON_SHARED_INC=128,
        VIR_MIGRATE_AUTO_CONVERGE=8192,
    )

    assert flags(bits) == 1 | 8 | 32 | 128 | 8192
    assert flags(bits, auto_converge=False) == 1 | 8 | 32 | 128
