"""Build a Debian guest with the real cloud-init, from Debian's packages (``make image-debian``).

The opt-in check of keel's config drives and metadata service against the reader most
images use. Three files in the output directory (``.keel/images/`` by default):

* ``debian-cloud.qcow2`` — an ext4 root file system (label ``cloudimg-rootfs``) made by
  ``mmdebstrap`` (Debian's bookworm, ``minbase``, through apt) with ``cloud-init``,
  ``openssh-server``, ``ifupdown``, ``isc-dhcp-client``, ``sudo`` and the cloud kernel,
  written into the image with ``mkfs.ext4 -d`` (no loop device or mount);
* ``debian-cloud-kernel`` and ``debian-cloud-initrd`` — that kernel and its initramfs,
  which servers boot directly (the image's ``os_command_line`` says ``root=/dev/vda``).

It boots without systemd, to be quick under emulation: ``/sbin/keel-init`` mounts what
the system needs and runs cloud-init's four stages as systemd would (``init --local``,
``ifup -a``, ``init``, ``modules --mode=config``, sshd, ``modules --mode=final``),
cloud-init's output going to the console; its data sources are the config drive, then
the metadata service (``datasource_list: [ConfigDrive, OpenStack, None]``). The default
user is Debian's ``debian``, with the key pair's key. One adaptation to QEMU's user-mode
network, whose DHCP offers no router: a dhclient hook then routes every address on the
link (see :data:`DHCLIENT_HOOK`).

Needs root (mmdebstrap runs the packages' scripts in the new system), ``mmdebstrap``,
``e2fsprogs`` and ``qemu-utils`` (``make image-debian`` installs the first when missing).
It takes a few minutes and about 1 GiB of scratch space; the build happens in a scratch
directory and is moved into place at the end.

Usage: ``python deploy/debianimage.py [--output DIR] [--force]``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DISK = "debian-cloud.qcow2"
KERNEL = "debian-cloud-kernel"
INITRD = "debian-cloud-initrd"
STAMP = "debian-cloud.stamp"
OUTPUTS = (DISK, KERNEL, INITRD)
SUITE = "bookworm"
PACKAGES = ("cloud-init", "openssh-server", "ifupdown", "isc-dhcp-client", "iproute2", "sudo",
            "linux-image-cloud-amd64", "e2fsprogs")  # fmt: skip
#: The root file system's size (the server's disk grows it to the flavor's).
ROOT_SIZE = "1536M"
#: The kernel command line servers of this image boot with.
KERNEL_ARGS = "root=/dev/vda rw console=ttyS0 init=/sbin/keel-init"
#: Seconds mmdebstrap may take.
BUILD_TIMEOUT = 1800

INIT = """#!/bin/sh
# keel's Debian test guest: cloud-init's stages in order, without systemd.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mkdir -p /run/sshd /run/network /run/lock
ip link set lo up
echo "keel-debian-up $(cat /sys/class/dmi/id/product_serial)"
cloud-init init --local
ifup -a --force
cloud-init init
cloud-init modules --mode=config
/usr/sbin/sshd
cloud-init modules --mode=final
echo "keel-debian-ready"
while true; do sleep 3600; done
"""

CLOUD_CFG = """# keel: the config drive first, then the metadata service; no waiting for others.
datasource_list: [ConfigDrive, OpenStack, None]
datasource:
  OpenStack:
    max_wait: 30
    timeout: 5
    retries: 5
"""

#: QEMU's restricted user-mode network offers a lease with no router (and the netmask
#: 0.0.0.0, for which Linux adds no route): the guest then reaches every address on the
#: link, where QEMU answers for its gateway and the metadata service. (cloud-init's own
#: short-lived DHCP in ``init --local`` runs no hooks; the metadata service is found by
#: ``init``, after ``ifup``.)
DHCLIENT_HOOK = """# keel: a lease without a router: every address is on the link.
case "$reason" in
    BOUND|RENEW|REBIND|REBOOT)
        if [ -z "$new_routers" ]; then
            ip -4 route replace default dev "$interface"
        fi
        ;;
esac
"""


class BuildError(Exception):
    pass


def run(*argv: str, timeout: float = 600) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise BuildError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{argv[0]} took longer than {timeout:g}s") from None
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def recipe_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def is_built(output: Path) -> bool:
    stamp = output / STAMP
    return (
        all((output / name).is_file() for name in OUTPUTS)
        and stamp.is_file()
        and stamp.read_text().strip() == recipe_digest()
    )


def customise(root: Path) -> None:
    """keel's init, cloud-init's data sources, a host name; no package caches."""
    init = root / "sbin" / "keel-init"
    init.write_text(INIT)
    init.chmod(0o755)
    (root / "etc" / "cloud" / "cloud.cfg.d" / "90-keel.cfg").write_text(CLOUD_CFG)
    (root / "etc" / "dhcp" / "dhclient-exit-hooks.d" / "keel-on-link").write_text(DHCLIENT_HOOK)
    (root / "etc" / "hostname").write_text("debian\n")
    interfaces = root / "etc" / "network" / "interfaces"
    interfaces.write_text("auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (root / cache).glob("*"):
            if entry.is_file():
                entry.unlink()


def build(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-debian-", dir=output) as scratch_name:
        scratch = Path(scratch_name)
        root = scratch / "root"
        run(
            "mmdebstrap", "--mode=root", "--variant=minbase", "--quiet",
            f"--include={','.join(PACKAGES)}", SUITE, str(root),
            timeout=BUILD_TIMEOUT,
        )  # fmt: skip
        customise(root)
        [vmlinuz] = (root / "boot").glob("vmlinuz-*")
        [initrd] = (root / "boot").glob("initrd.img-*")
        shutil.copyfile(vmlinuz, scratch / KERNEL)
        shutil.copyfile(initrd, scratch / INITRD)
        raw = scratch / "root.raw"
        run("mkfs.ext4", "-q", "-L", "cloudimg-rootfs", "-d", str(root), str(raw), ROOT_SIZE)
        run("qemu-img", "convert", "-q", "-c", "-f", "raw", "-O", "qcow2", str(raw),
            str(scratch / DISK))  # fmt: skip
        (scratch / STAMP).write_text(recipe_digest() + "\n")
        for name in (*OUTPUTS, STAMP):
            (scratch / name).replace(output / name)
        print(f"built {', '.join(OUTPUTS)} in {output} ({vmlinuz.name})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path(".keel/images"))
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    if not args.force and is_built(args.output):
        print(f"the Debian guest is already built in {args.output} (--force rebuilds it)")
        return 0
    try:
        build(args.output)
    except BuildError as exc:
        print(f"cannot build the Debian guest: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
