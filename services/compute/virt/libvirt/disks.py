"""A libvirt guest's files: hard links to cached images and a qcow2 overlay.

Hard links keep a guest's base image, kernel and ramdisk alive whatever the image cache
evicts (both live in the agent's state directory, on one file system; across file
systems they are copied). The overlay names its backing file relatively (``base``), so
the guest's directory can be renamed into place after it is assembled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from services.compute.rpcapi import BootSource, GuestDisk, InstanceSpec
from shared.exceptions import BuildFailed

BASE = "base"
DISK = "disk"
KERNEL = "kernel"
RAMDISK = "ramdisk"
CONSOLE_LOG = "console.log"
#: Seconds qemu-img may take to create an overlay.
QEMU_IMG_TIMEOUT = 120.0


#: Seconds copying a migrated disk may take.
COPY_TIMEOUT = 3600.0


class DiskCopy:
    """A cold migration's disk, copied from its source: a file copy on the same machine,
    ``scp`` from the source machine otherwise (as Nova, the compute hosts must trust
    each other's SSH keys). The copy names the same relative backing file (``base``),
    which the destination has from its own verified image cache."""

    def __init__(self, source: GuestDisk, *, local: bool) -> None:
        self.source = source
        self.local = local

    def into(self, target: Path) -> None:
        if self.local:
            try:
                shutil.copyfile(self.source.path, target)
            except OSError as exc:
                raise BuildFailed(
                    f"cannot copy the migrated disk {self.source.path}: {exc.strerror or exc}"
                ) from None
            return
        argv = ["scp", "-q", "-o", "BatchMode=yes",
                f"{self.source.machine}:{self.source.path}", str(target)]  # fmt: skip
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=COPY_TIMEOUT, check=False
            )
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise BuildFailed(f"cannot copy the migrated disk with scp: {exc}") from None
        if done.returncode != 0:
            raise BuildFailed(
                f"cannot copy the migrated disk from {self.source.machine}: {done.stderr.strip()}"
            )


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def backing_format(disk_format: str | None) -> str:
    if disk_format in (None, "qcow2"):
        return "qcow2"
    if disk_format == "raw":
        return "raw"
    raise BuildFailed(
        f"images of disk format {disk_format!r} cannot back a guest disk here; use qcow2 or raw"
    )


def assemble(directory: Path, spec: InstanceSpec, boot: BootSource, fetched: list[Path]) -> None:
    """Fill ``directory`` with the guest's files; ``fetched`` is image, kernel, ramdisk."""
    image, *parts = fetched
    link_or_copy(image, directory / BASE)
    names = [KERNEL, RAMDISK][: len(parts)] if boot.kernel else []
    for name, path in zip(names, parts, strict=False):
        link_or_copy(path, directory / name)
    argv = [
        "qemu-img",
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        backing_format(boot.image.disk_format),
        "-b",
        BASE,
        DISK,
    ]
    if spec.flavor.root_gb:
        argv.append(f"{spec.flavor.root_gb}G")
    try:
        done = subprocess.run(
            argv,
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=QEMU_IMG_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise BuildFailed("qemu-img is not installed (Debian: qemu-utils)") from None
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"qemu-img took longer than {QEMU_IMG_TIMEOUT:g}s") from None
    if done.returncode != 0:
        raise BuildFailed(f"qemu-img could not create the disk of {spec.uuid}: {done.stderr}")


def grow(disk: Path, root_gb: int) -> None:
    """Make the guest's overlay at least ``root_gb`` GiB (never shrink it): a resize."""
    if not root_gb:
        return
    argv = ["qemu-img", "resize", "-q", str(disk), f"{root_gb}G"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=QEMU_IMG_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise BuildFailed("qemu-img is not installed (Debian: qemu-utils)") from None
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"qemu-img took longer than {QEMU_IMG_TIMEOUT:g}s") from None
    if done.returncode != 0 and "shrink" not in done.stderr.lower():
        raise BuildFailed(f"qemu-img could not grow {disk} to {root_gb} GiB: {done.stderr}")


#: Seconds qemu-img may take to convert a guest's disk for a snapshot.
CONVERT_TIMEOUT = 1800.0


def convert(disk: Path, target: Path, disk_format: str) -> None:
    """Write ``disk`` (with its backing chain) whole into ``target`` in ``disk_format``."""
    argv = ["qemu-img", "convert", "-q", "-U", "-O", disk_format, str(disk), str(target)]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=CONVERT_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise BuildFailed("qemu-img is not installed (Debian: qemu-utils)") from None
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"qemu-img took longer than {CONVERT_TIMEOUT:g}s") from None
    if done.returncode != 0:
        raise BuildFailed(f"qemu-img could not convert {disk}: {done.stderr.strip()}")
