"""Debian's cloud-init in a keel guest: the key pair and the user data, from the config
drive and from the metadata service.

One cloud on the libvirt driver, two servers of the Debian guest booted at once (one
with ``--config-drive true``, one reading the metadata service), each with the key pair
``k`` and a user data script. cloud-init must run the script (its output is on the
console) and install the key for the default user ``debian``, so SSH through the
server's forward, as ``debian``, runs ``hostname`` and prints the server's name. Each
step's seconds are printed (``-s``): the figures docs/libvirt.md quotes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from deploy import debianimage
from tests.e2e.cloud import Cloud
from tests.e2e.moves import until_server
from tests.libvirt.cloud import HOSTS, libvirt_cloud
from tests.libvirt.guests import free_port, make_key, ssh_run

FLAVOR = "keel.debian"
#: Seconds cloud-init may take to run the user data (Python under software emulation).
CLOUD_INIT_TIMEOUT = 900.0


def upload_debian(cloud: Cloud, images: Path) -> None:
    ids = {}
    for name, file, fmt in (
        ("debian-cloud-kernel", debianimage.KERNEL, "aki"),
        ("debian-cloud-initrd", debianimage.INITRD, "ari"),
    ):
        made = cloud.openstack(
            "image", "create", "--file", str(images / file), "--disk-format", fmt,
            "--container-format", fmt, "--public", name,
        )  # fmt: skip
        ids[name] = made["id"]
    cloud.openstack(
        "image", "create", "--file", str(images / debianimage.DISK), "--disk-format", "qcow2",
        "--container-format", "bare", "--public",
        "--property", f"kernel_id={ids['debian-cloud-kernel']}",
        "--property", f"ramdisk_id={ids['debian-cloud-initrd']}",
        "--property", f"os_command_line={debianimage.KERNEL_ARGS}",
        "debian-cloud",
    )  # fmt: skip


async def console_shows(cloud: Cloud, server_id: str, text: str) -> str:
    deadline = time.monotonic() + CLOUD_INIT_TIMEOUT
    while True:
        log: str = cloud.openstack("console", "log", "show", server_id, as_json=False)
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{text!r} not on {server_id}'s console:\n{log}"
        await asyncio.sleep(5)


@pytest.mark.timeout(CLOUD_INIT_TIMEOUT * 2)
async def test_cloud_init_installs_the_key_and_runs_the_user_data_from_both_sources(
    guest_images: Path, debian_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    workdir = tmp_path_factory.mktemp("debian")
    (workdir / "cloud").mkdir()
    key, _ = make_key(workdir, "debian-key")
    script = workdir / "script.sh"
    script.write_text("#!/bin/sh\necho user-data-ran-on-$(hostname)\n")
    ports = {host: free_port() for host in HOSTS}
    began = time.monotonic()
    async with libvirt_cloud(workdir / "cloud", guest_images, ports) as cloud:
        upload_debian(cloud, debian_images)
        cloud.openstack("flavor", "create", "--ram", "512", "--disk", "3", "--vcpus", "1", FLAVOR)
        cloud.openstack("keypair", "create", "--public-key", f"{key}.pub", "k")
        print(f"cloud ready: {time.monotonic() - began:.0f}s")
        servers = {}
        for name, extra in (("from-drive", ("--config-drive", "true")), ("from-service", ())):
            servers[name] = cloud.openstack(
                "--os-compute-api-version", "2.74", "server", "create", "--flavor", FLAVOR,
                "--image", "debian-cloud", "--host", HOSTS[0], "--key-name", "k",
                "--user-data", str(script), *extra, name,
            )["id"]  # fmt: skip
        seen = {}
        for name, server_id in servers.items():
            started = time.monotonic()
            await until_server(cloud, server_id, "ACTIVE")
            # keel-init says so once cloud-init's last stage is over.
            log = await console_shows(cloud, server_id, "keel-debian-ready")
            addresses = cloud.openstack("server", "show", server_id)["addresses"]
            [forward] = addresses["forwarded"]
            hostname = await ssh_run(forward, ports[HOSTS[0]], key, "hostname", user="debian")
            seen[name] = (log, hostname.strip())
            print(f"{name}: user data ran and SSH answered after {time.monotonic() - started:.0f}s")
    print(f"whole test: {time.monotonic() - began:.0f}s")

    for name, (log, hostname) in seen.items():
        assert hostname == name
        assert f"user-data-ran-on-{name}" in log
    assert "DataSourceConfigDrive" in seen["from-drive"][0]
    assert "DataSourceOpenStack" in seen["from-service"][0]
