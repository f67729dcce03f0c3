"""Build keel's test guest from Debian packages (``make image``).

The guest is three files in the output directory (``.keel/images/`` by default):

* ``keel-test-kernel`` — the kernel, extracted with ``dpkg-deb`` from the package
  ``linux-image-cloud-amd64`` depends on (never installed on this machine);
* ``keel-test-ramdisk`` — a gzipped initramfs: a static busybox (from
  ``busybox-static``), dropbear (``dropbear-bin``, with the shared libraries it needs from
  their Debian packages), the kernel modules of the ACPI power button, virtio (network,
  disks) and ISO 9660, and ``deploy/guest/init``: a tiny stand-in for cloud-init. It
  prints ``keel-guest-up <SMBIOS serial>`` (the server's UUID, which the libvirt driver
  sets as the serial), reads the config drive (a disk labelled ``config-2``) or else the
  metadata service at 169.254.169.254, sets the host name, configures the interface
  (``network_data.json``, or DHCP), installs the ``public_keys`` for root, starts dropbear
  on port 22 and runs the user data when it is a script, printing one line for each
  (``keel-guest-source``, ``keel-guest-hostname``, ``keel-guest-ip``, ``keel-guest-key
  <comment>``; the script's output follows); it powers off when the ACPI power button is
  pressed (a clean shutdown or reboot through libvirt);
* ``keel-test.qcow2`` — a small empty qcow2 root disk, the image servers boot from.

The packages are fetched with ``apt-get download`` (run ``apt-get update`` first on a
fresh machine); nothing is installed. Everything is built in a scratch directory and
moved into place at the end, so an interrupted build leaves no partial image. The
initramfs is written with fixed times and owners, so a rebuild from the same packages
gives the same bytes.

Usage: ``python deploy/guestimage.py [--output DIR] [--force]``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

KERNEL = "keel-test-kernel"
RAMDISK = "keel-test-ramdisk"
DISK = "keel-test.qcow2"
#: What the guest was built from (a digest of its build recipe and files): a checkout
#: whose recipe changed rebuilds it.
STAMP = "keel-test.stamp"
OUTPUTS = (KERNEL, RAMDISK, DISK)
DISK_SIZE = "64M"
KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
BUSYBOX_PACKAGE = "busybox-static"
#: dropbear and the packages of the shared libraries it loads.
DROPBEAR_PACKAGES = ("dropbear-bin", "libc6", "libcrypt1", "libtomcrypt1", "libtommath1",
                     "zlib1g", "libgmp10")  # fmt: skip
#: Kernel modules the init loads (what they depend on is loaded first): the ACPI power
#: button and its event devices, virtio's PCI transport, network and disks, ISO 9660.
MODULES = (
    "drivers/input/evdev.ko",
    "drivers/acpi/button.ko",
    "drivers/virtio/virtio_pci.ko",
    "drivers/net/virtio_net.ko",
    "drivers/block/virtio_blk.ko",
    "fs/isofs/isofs.ko",
)
#: The guest's own files: its init and DHCP hook.
GUEST_FILES = Path(__file__).resolve().parent / "guest"
LIBRARY_DIR = "lib/x86_64-linux-gnu"
LOADER = "ld-linux-x86-64.so.2"
PASSWD = "root:x:0:0:root:/root:/bin/sh\n"

POWER_BUTTON = """#!/bin/sh
echo "keel-guest-down: power button pressed, powering off"
poweroff -f
"""


class BuildError(Exception):
    pass


def run(*argv: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise BuildError(f"{argv[0]} is not installed") from None
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def kernel_package() -> str:
    """The versioned kernel package the cloud meta-package depends on."""
    out = run("apt-cache", "depends", KERNEL_META_PACKAGE)
    for line in out.splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and name.startswith("linux-image-"):
            return name
    raise BuildError(
        f"apt does not know {KERNEL_META_PACKAGE}; run `apt-get update` (as root) and retry"
    )


def extract(package: str, scratch: Path) -> Path:
    """Download ``package``'s .deb into ``scratch`` and unpack it; its root directory."""
    run("apt-get", "download", package, cwd=scratch)
    [deb] = scratch.glob(f"{package}_*.deb")
    root = scratch / package
    run("dpkg-deb", "-x", str(deb), str(root))
    return root


class Cpio:
    """A ``newc`` cpio archive with fixed times and root ownership."""

    def __init__(self) -> None:
        self.stream = io.BytesIO()
        self.inode = 1

    def _entry(self, name: str, mode: int, data: bytes) -> None:
        fields = (self.inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0)
        header = "070701" + "".join(f"{value:08X}" for value in fields)
        self.inode += 1
        self.stream.write(header.encode() + name.encode() + b"\0")
        self.stream.write(b"\0" * (-(110 + len(name) + 1) % 4))
        self.stream.write(data)
        self.stream.write(b"\0" * (-len(data) % 4))

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755, b"")

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0, b"")
        return self.stream.getvalue()


@dataclass
class GuestParts:
    """What goes into the initramfs besides keel's own files."""

    busybox: bytes
    #: Module file name → its data, in the order they must be loaded.
    modules: dict[str, bytes]
    dropbear: bytes
    #: Shared library name → its data (the loader among them).
    libraries: dict[str, bytes]


def module_depends(data: bytes) -> list[str]:
    """The modules a kernel module names in its ``depends=`` field."""
    for field in data.split(b"\0"):
        if field.startswith(b"depends="):
            return [name for name in field[8:].decode().split(",") if name]
    return []


def modules_in_order(module_dir: Path) -> dict[str, bytes]:
    """:data:`MODULES` and everything they depend on, each after its dependencies."""
    by_name = {path.stem: path for path in (module_dir / "kernel").rglob("*.ko")}
    ordered: dict[str, bytes] = {}

    def add(name: str) -> None:
        if f"{name}.ko" in ordered:
            return
        if name not in by_name:
            raise BuildError(f"the kernel has no module {name}")
        data = by_name[name].read_bytes()
        for dependency in module_depends(data):
            add(dependency)
        ordered[f"{name}.ko"] = data

    for path in MODULES:
        add(Path(path).stem)
    return ordered


def needed_libraries(binary: Path, roots: list[Path]) -> dict[str, bytes]:
    """The shared libraries ``binary`` loads (and theirs), found under ``roots``."""
    found: dict[str, bytes] = {}
    pending = [binary]
    while pending:
        out = run("readelf", "-d", str(pending.pop()))
        for line in out.splitlines():
            if "(NEEDED)" not in line:
                continue
            name = line.rsplit("[", 1)[1].rstrip("]")
            if name in found:
                continue
            path = _find(name, roots)
            found[name] = path.read_bytes()
            pending.append(path)
    found[LOADER] = _find(LOADER, roots).read_bytes()
    return found


def _find(name: str, roots: list[Path]) -> Path:
    """The file ``name`` in one of the unpacked packages, symbolic links followed inside
    the package (never to this machine's own files)."""
    for root in roots:
        for found in root.rglob(name):
            path = found
            while path.is_symlink():
                target = os.readlink(path)
                path = root / target.lstrip("/") if target.startswith("/") else path.parent / target
            if path.is_file():
                return path
    raise BuildError(f"no package downloaded has {name}")


def initramfs(parts: GuestParts) -> bytes:
    archive = Cpio()
    for directory in ("bin", "dev", "proc", "sys", "lib", "lib/modules", "lib64", "etc",
                      "etc/acpi", "etc/acpi/PWRF", "etc/dropbear", "lib/x86_64-linux-gnu",
                      "mnt", "root", "tmp"):  # fmt: skip
        archive.directory(directory)
    archive.file("bin/busybox", parts.busybox, 0o755)
    archive.file("bin/dropbear", parts.dropbear, 0o755)
    archive.file("init", (GUEST_FILES / "init").read_bytes(), 0o755)
    archive.file("etc/udhcpc.script", (GUEST_FILES / "udhcpc.script").read_bytes(), 0o755)
    archive.file("etc/passwd", PASSWD.encode())
    archive.file("etc/acpi/PWRF/00000080", POWER_BUTTON.encode(), 0o755)
    for name, data in parts.libraries.items():
        archive.file(f"{LIBRARY_DIR}/{name}", data, 0o755)
    archive.file(f"lib64/{LOADER}", parts.libraries[LOADER], 0o755)
    for name, data in parts.modules.items():
        archive.file(f"lib/modules/{name}", data)
    archive.file("lib/modules/order", "".join(f"{name}\n" for name in parts.modules).encode())
    return gzip.compress(archive.finish(), mtime=0)


def build(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=output) as scratch_name:
        scratch = Path(scratch_name)
        kernel_root = extract(kernel_package(), scratch)
        busybox_root = extract(BUSYBOX_PACKAGE, scratch)
        roots = [extract(package, scratch) for package in DROPBEAR_PACKAGES]
        [vmlinuz] = (kernel_root / "boot").glob("vmlinuz-*")
        [module_dir] = (kernel_root / "lib" / "modules").iterdir()
        dropbear = roots[0] / "usr" / "sbin" / "dropbear"
        parts = GuestParts(
            busybox=(busybox_root / "bin" / "busybox").read_bytes(),
            modules=modules_in_order(module_dir),
            dropbear=dropbear.read_bytes(),
            libraries=needed_libraries(dropbear, roots),
        )
        shutil.copyfile(vmlinuz, scratch / KERNEL)
        (scratch / RAMDISK).write_bytes(initramfs(parts))
        run("qemu-img", "create", "-q", "-f", "qcow2", str(scratch / DISK), DISK_SIZE)
        (scratch / STAMP).write_text(recipe_digest() + "\n")
        for name in (*OUTPUTS, STAMP):
            (scratch / name).replace(output / name)
        print(f"built {', '.join(OUTPUTS)} in {output} (kernel {module_dir.name})")


def recipe_digest() -> str:
    """A digest of this script and the guest's files: what the built guest depends on."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(GUEST_FILES.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def is_built(output: Path) -> bool:
    stamp = output / STAMP
    return (
        all((output / name).is_file() for name in OUTPUTS)
        and stamp.is_file()
        and stamp.read_text().strip() == recipe_digest()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path(".keel/images"))
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    if not args.force and is_built(args.output):
        print(f"the test guest is already built in {args.output} (--force rebuilds it)")
        return 0
    try:
        build(args.output)
    except BuildError as exc:
        print(f"cannot build the test guest: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
