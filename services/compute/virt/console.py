"""Guest console logs: what a driver returns of one, and what the local drivers write.

A console log is a file the guest's serial console is written to (by QEMU for the
libvirt driver; by the driver itself for the local one, which has no guest to speak).
Only its end is ever read: at most :data:`~services.compute.virt.driver.MAX_CONSOLE_BYTES`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from services.compute.rpcapi import InstanceSpec
from services.compute.virt.driver import MAX_CONSOLE_BYTES
from shared.exceptions import ConsoleNotAvailable

#: What a booted guest prints first, as the test image's init does: tests and operators
#: look for it.
UP_MARKER = "keel-guest-up"


def up_line(instance_uuid: UUID) -> str:
    return f"{UP_MARKER} {instance_uuid}"


def boot_banner(spec: InstanceSpec, hypervisor: str) -> str:
    """What a simulated guest "prints" when it is made: its sizes, then the up marker."""
    flavor = spec.flavor
    lines = [
        f"keel simulated guest {spec.uuid} booting",
        f"  name: {spec.display_name}",
        f"  hypervisor: {hypervisor}",
        f"  flavor: {flavor.name}",
        f"  vcpus: {flavor.vcpus}",
        f"  memory: {flavor.memory_mb} MB",
        f"  root disk: {flavor.root_gb} GB",
        f"  image: {spec.image_ref or 'none'}",
        f"  addresses: {', '.join(ip.address for ip in spec.addresses) or 'none'}",
        f"  metadata items: {len(spec.metadata)}",
        f"  user data: {'given' if spec.user_data else 'none'}",
        up_line(spec.uuid),
    ]
    return "".join(stamped(line) for line in lines)


def read_tail(path: Path, limit: int = MAX_CONSOLE_BYTES) -> bytes:
    """The last ``limit`` bytes of ``path``; empty when it does not exist (yet)."""
    try:
        with path.open("rb") as log:
            size = os.fstat(log.fileno()).st_size
            log.seek(max(size - limit, 0))
            return log.read(limit)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise ConsoleNotAvailable(
            f"the console log {path} cannot be read: {exc.strerror or exc}"
        ) from None


def stamped(text: str) -> str:
    """``text`` as one console line, with the time (UTC) it was written."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"[{now}] {text}\n"


def append_line(path: Path, text: str) -> None:
    """Add a stamped line to the console log at ``path`` (created if missing)."""
    with path.open("a", encoding="utf-8") as log:
        log.write(stamped(text))
