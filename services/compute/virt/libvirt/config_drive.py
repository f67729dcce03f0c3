"""A guest's config drive: an ISO 9660 image labelled ``config-2``.

Its files are :func:`shared.guest_metadata.config_drive_files` (OpenStack's layout and
the EC2 part), written as Nova writes them, with ``genisoimage`` (Debian:
``genisoimage``) and Rock Ridge and Joliet names, so cloud-init (which finds it by its
label) and the test guest read it. It is made once, when the guest's directory is
assembled, and attached read-only as the guest's second virtio disk.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from services.compute.rpcapi import InstanceSpec
from shared.exceptions import BuildFailed
from shared.guest_metadata import GuestInfo, config_drive_files

#: The drive's file name in the guest's directory.
CONFIG_DRIVE = "disk.config"
LABEL = "config-2"
#: Seconds genisoimage may take.
MAKE_TIMEOUT = 60.0


def guest_info(spec: InstanceSpec) -> GuestInfo:
    """What the guest is told of itself, from the build the agent was sent."""
    return GuestInfo(
        uuid=spec.uuid,
        name=spec.display_name,
        project_id=spec.project_id,
        availability_zone=spec.availability_zone,
        launch_index=spec.launch_index,
        flavor_name=spec.flavor.name,
        key_name=spec.key_name,
        key_data=spec.key_data,
        metadata=spec.metadata,
        user_data=spec.user_data,
        addresses=spec.addresses,
        hostname=spec.hostname,
    )


def make(spec: InstanceSpec, target: Path) -> None:
    """Write ``spec``'s config drive to ``target``."""
    with tempfile.TemporaryDirectory(prefix=".config-drive-", dir=target.parent) as scratch:
        root = Path(scratch) / "root"
        for name, data in config_drive_files(guest_info(spec)).items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        argv = ["genisoimage", "-o", str(target), "-ldots", "-allow-lowercase",
                "-allow-multidot", "-l", "-publisher", "keel", "-quiet", "-J", "-r",
                "-V", LABEL, str(root)]  # fmt: skip
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=MAKE_TIMEOUT, check=False
            )
        except FileNotFoundError:
            raise BuildFailed(
                "config drives need genisoimage (Debian: genisoimage), which is not installed"
            ) from None
        except subprocess.TimeoutExpired:
            raise BuildFailed(f"genisoimage took longer than {MAKE_TIMEOUT:g}s") from None
        if done.returncode != 0:
            raise BuildFailed(
                f"genisoimage could not make the config drive of {spec.uuid}: {done.stderr}"
            )
