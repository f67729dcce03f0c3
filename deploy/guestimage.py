"""Build keel's test guest from Debian packages (``make image``).

The guest is three files in the output directory (``.keel/images/`` by default):

* ``keel-test-kernel`` — the kernel, extracted with ``dpkg-deb`` from the package
  ``linux-image-cloud-amd64`` depends on (never installed on this machine);
* ``keel-test-ramdisk`` — a gzipped initramfs: a static busybox (from
  ``busybox-static``), the kernel's ACPI power-button and event-device modules, and an
  ``/init`` that prints ``keel-guest-up <SMBIOS serial>`` (the server's UUID, which the
  libvirt driver sets as the serial) to the console, then powers off when the ACPI power
  button is pressed (a clean shutdown or reboot through libvirt);
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
import io
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL = "keel-test-kernel"
RAMDISK = "keel-test-ramdisk"
DISK = "keel-test.qcow2"
OUTPUTS = (KERNEL, RAMDISK, DISK)
DISK_SIZE = "64M"
KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
BUSYBOX_PACKAGE = "busybox-static"
#: Kernel modules the init loads, in order: event devices, then the ACPI button.
MODULES = ("drivers/input/evdev.ko", "drivers/acpi/button.ko")

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
serial=$(cat /sys/class/dmi/id/product_serial 2>/dev/null)
echo "keel-guest-up ${serial:-unknown}"
for module in /lib/modules/*.ko; do insmod "$module" 2>/dev/null; done
acpid -d -c /etc/acpi -l /dev/null &
while true; do sleep 3600; done
"""

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


def initramfs(busybox: bytes, modules: dict[str, bytes]) -> bytes:
    archive = Cpio()
    for directory in ("bin", "dev", "proc", "sys", "lib", "lib/modules", "etc", "etc/acpi"):
        archive.directory(directory)
    archive.directory("etc/acpi/PWRF")
    archive.file("bin/busybox", busybox, 0o755)
    archive.file("init", INIT.encode(), 0o755)
    archive.file("etc/acpi/PWRF/00000080", POWER_BUTTON.encode(), 0o755)
    for index, (name, data) in enumerate(modules.items()):
        archive.file(f"lib/modules/{index}-{name}", data)
    return gzip.compress(archive.finish(), mtime=0)


def build(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=output) as scratch_name:
        scratch = Path(scratch_name)
        kernel_root = extract(kernel_package(), scratch)
        busybox_root = extract(BUSYBOX_PACKAGE, scratch)
        [vmlinuz] = (kernel_root / "boot").glob("vmlinuz-*")
        [module_dir] = (kernel_root / "lib" / "modules").iterdir()
        modules = {Path(path).name: (module_dir / "kernel" / path).read_bytes() for path in MODULES}
        busybox = (busybox_root / "bin" / "busybox").read_bytes()
        shutil.copyfile(vmlinuz, scratch / KERNEL)
        (scratch / RAMDISK).write_bytes(initramfs(busybox, modules))
        run("qemu-img", "create", "-q", "-f", "qcow2", str(scratch / DISK), DISK_SIZE)
        for name in OUTPUTS:
            (scratch / name).replace(output / name)
        print(f"built {', '.join(OUTPUTS)} in {output} (kernel {module_dir.name})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path(".keel/images"))
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    if not args.force and all((args.output / name).is_file() for name in OUTPUTS):
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
