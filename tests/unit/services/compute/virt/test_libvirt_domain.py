"""The libvirt driver's domain XML and metadata, without libvirt."""

from __future__ import annotations

import uuid
from pathlib import Path
from xml.etree import ElementTree

import pytest

from services.compute.virt.libvirt import driver as libvirt_driver
from services.compute.virt.libvirt.domain import (
    NAMESPACE,
    GuestFiles,
    Metadata,
    domain_name,
    domain_uuid,
    domain_xml,
    metadata_element,
    parse_metadata,
)
from tests.unit.services.compute.standin import make_spec

NODE = uuid.UUID("1b05af30-30c0-4caa-b955-d8de5b689128")


def _files(kernel: bool = True) -> GuestFiles:
    guest = Path("/var/lib/keel/instances/x")
    return GuestFiles(
        disk=guest / "disk",
        console_log=guest / "console.log",
        kernel=guest / "kernel" if kernel else None,
        ramdisk=guest / "ramdisk" if kernel else None,
    )


def test_a_domain_is_named_by_node_and_server_and_carries_the_serial() -> None:
    spec = make_spec()

    root = ElementTree.fromstring(
        domain_xml(spec, node_uuid=NODE, domain_type="qemu", files=_files(), made_by="build")
    )

    assert root.get("type") == "qemu"
    assert root.findtext("name") == f"keel-1b05af30-{spec.uuid}"
    assert root.findtext("uuid") == str(domain_uuid(NODE, spec.uuid))
    serial = root.find("sysinfo/system/entry[@name='serial']")
    assert serial is not None
    assert serial.text == str(spec.uuid)
    assert root.findtext("os/kernel") == "/var/lib/keel/instances/x/kernel"
    assert root.findtext("os/cmdline") == "console=ttyS0"
    log = root.find("devices/serial/log")
    assert log is not None
    assert log.get("file") == "/var/lib/keel/instances/x/console.log"
    assert root.findtext("memory") == str(spec.flavor.memory_mb)


def test_an_image_without_a_kernel_boots_from_its_disk() -> None:
    root = ElementTree.fromstring(
        domain_xml(
            make_spec(), node_uuid=NODE, domain_type="kvm", files=_files(False), made_by="move"
        )
    )

    assert root.find("os/kernel") is None
    boot = root.find("os/boot")
    assert boot is not None
    assert boot.get("dev") == "hd"


def test_the_same_server_on_two_nodes_gets_two_domains() -> None:
    server, other_node = uuid.uuid4(), uuid.uuid4()

    assert domain_uuid(NODE, server) != domain_uuid(other_node, server)
    assert domain_name(NODE, server) != domain_name(other_node, server)
    assert domain_uuid(NODE, server) == domain_uuid(NODE, server)


def test_metadata_reads_back_as_libvirt_returns_it() -> None:
    meta = Metadata(uuid.uuid4(), NODE, "build")
    text = ElementTree.tostring(metadata_element(meta, "web-1"), encoding="unicode")

    assert NAMESPACE in text
    assert parse_metadata(text) == meta
    assert parse_metadata("<instance><uuid>nope</uuid></instance>") is None
    assert parse_metadata("not xml") is None


@pytest.mark.parametrize(
    ("setting", "cpuinfo", "kvm_opens", "chosen"),
    [
        ("kvm", "", False, "kvm"),
        ("qemu", " vmx", True, "qemu"),
        ("auto", "flags : fpu vmx sse", True, "kvm"),
        ("auto", "flags : fpu sse", True, "qemu"),
        ("auto", "flags : fpu svm", False, "qemu"),
    ],
)
def test_auto_picks_kvm_only_when_it_can_work(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *,
    setting: str,
    cpuinfo: str,
    kvm_opens: bool,
    chosen: str,
) -> None:
    fake_cpuinfo = tmp_path / "cpuinfo"
    fake_cpuinfo.write_text(cpuinfo)
    real_open = open

    def fake_open(path: str, *args: object, **kwargs: object) -> object:
        if path == "/proc/cpuinfo":
            return real_open(fake_cpuinfo, *args, **kwargs)  # type: ignore[call-overload]
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    def fake_os_open(path: str, flags: int) -> int:
        if not kvm_opens:
            raise PermissionError(path)
        return 99

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr("os.open", fake_os_open)
    monkeypatch.setattr("os.close", lambda fd: None)

    assert libvirt_driver.choose_domain_type(setting)[0] == chosen
