"""A whole cloud on the libvirt driver: real processes, real guests, the stock client.

Two agents (distinct node identities and hypervisor names) share this machine's
libvirtd. The test guest is uploaded with ``openstack image create --file``, as an
operator would; servers boot it with a 128 MiB flavor.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deploy import guestimage
from services.compute.virt.libvirt.domain import domain_uuid
from tests.e2e.cloud import Cloud, CloudConfig, running_cloud
from tests.e2e.moves import service_set, until_record, until_server

HOSTS = ("lv-a", "lv-b")
FLAVOR = "keel.guest"
BOOT_TIMEOUT = 60.0


def agent_settings(host: str) -> dict[str, str]:
    return {"KEEL_COMPUTE__HYPERVISOR_HOSTNAME": host, "KEEL_COMPUTE__RECONCILE_INTERVAL": "1"}


@pytest.fixture(scope="module")
async def cloud(
    guest_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cloud]:
    workdir = tmp_path_factory.mktemp("libvirt-cloud")
    env = (
        ("KEEL_COMPUTE__DRIVER", "libvirt"),
        ("KEEL_IMAGES__URL_SECRET", "libvirt-tier-secret-0123456789"),
        ("KEEL_IMAGES__STORE_DIR", str(workdir / "image-store")),
        ("KEEL_LIBVIRT__SHUTDOWN_TIMEOUT", "15"),
        ("KEEL_FENCING__MARGIN", "2"),
    )
    # A short fence lease: a forced-down host's evacuation waits for it (test_fence.py).
    config = CloudConfig(computes=(), env=env, self_fence_after=20)
    async with running_cloud(workdir, config) as running:
        for host in HOSTS:
            running.start(host, "keel-compute", host, **agent_settings(host))
        for host in HOSTS:
            await running.wait_for_service(host, up=True)
        upload_guest(running, guest_images)
        running.openstack("flavor", "create", "--ram", "128", "--disk", "1", "--vcpus", "1", FLAVOR)
        yield running
        for server in running.openstack("server", "list"):
            running.openstack("server", "delete", "--wait", server["ID"], as_json=False)


def upload_guest(cloud: Cloud, images: Path) -> None:
    ids = {}
    for name, file, fmt in (
        ("keel-test-kernel", guestimage.KERNEL, "aki"),
        ("keel-test-ramdisk", guestimage.RAMDISK, "ari"),
    ):
        made = cloud.openstack(
            "image", "create", "--file", str(images / file), "--disk-format", fmt,
            "--container-format", fmt, "--public", name,
        )  # fmt: skip
        ids[name] = made["id"]
    cloud.openstack(
        "image", "create", "--file", str(images / guestimage.DISK), "--disk-format", "qcow2",
        "--container-format", "bare", "--public",
        "--property", f"kernel_id={ids['keel-test-kernel']}",
        "--property", f"ramdisk_id={ids['keel-test-ramdisk']}",
        "keel-test",
    )  # fmt: skip


def libvirt_domain(host_node: str, server_id: str, libvirt_uri: str) -> Any:
    import libvirt  # noqa: PLC0415

    conn = libvirt.open(libvirt_uri)
    try:
        return conn.lookupByUUIDString(str(domain_uuid(uuid_of(host_node), uuid_of(server_id))))
    except libvirt.libvirtError:
        return None


def uuid_of(text: str) -> Any:
    import uuid  # noqa: PLC0415

    return uuid.UUID(text)


def node_uuid(cloud: Cloud, host: str) -> str:
    return (cloud.state_dir(host) / "compute_id").read_text().strip()


def domain_state(cloud: Cloud, host: str, server_id: str, uri: str) -> str | None:
    """``running``, ``off``, or None when the host has no domain for the server."""
    dom = libvirt_domain(node_uuid(cloud, host), server_id, uri)
    if dom is None:
        return None
    return "running" if dom.isActive() else "off"


async def console_shows(cloud: Cloud, server_id: str, count: int) -> str:
    marker = f"keel-guest-up {server_id}"
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        text: str = cloud.openstack("console", "log", "show", server_id, as_json=False)
        if text.count(marker) >= count:
            return text
        assert time.monotonic() < deadline, f"boot {count} of {server_id} not seen:\n{text}"
        await asyncio.sleep(1)


def create(cloud: Cloud, name: str, host: str) -> dict[str, Any]:
    server: dict[str, Any] = cloud.openstack(
        "--os-compute-api-version", "2.74", "server", "create", "--flavor", FLAVOR,
        "--image", "keel-test", "--host", host, "--wait", name,
    )  # fmt: skip
    assert server["status"] == "ACTIVE", server
    return server


async def test_the_stock_client_saves_an_image_byte_for_byte(
    cloud: Cloud, guest_images: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "kernel"

    cloud.openstack("image", "save", "--file", str(saved), "keel-test-kernel", as_json=False)

    assert saved.read_bytes() == (guest_images / guestimage.KERNEL).read_bytes()


async def test_a_server_boots_shows_its_uuid_and_obeys_stop_start_reboot_delete(
    cloud: Cloud, libvirt_uri: str
) -> None:
    server = create(cloud, "first", HOSTS[0])
    sid = server["id"]

    await console_shows(cloud, sid, 1)
    cloud.openstack("server", "stop", sid, as_json=False)
    await until_server(cloud, sid, "SHUTOFF")
    stopped = domain_state(cloud, HOSTS[0], sid, libvirt_uri)
    cloud.openstack("server", "start", sid, as_json=False)
    await until_server(cloud, sid, "ACTIVE")
    await console_shows(cloud, sid, 2)
    cloud.openstack("server", "reboot", sid, as_json=False)
    await until_server(cloud, sid, "ACTIVE")
    text = await console_shows(cloud, sid, 3)
    guest_dir = cloud.state_dir(HOSTS[0]) / "instances" / sid
    assert guest_dir.is_dir()
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)

    assert stopped == "off"
    assert "power button pressed" in text
    assert domain_state(cloud, HOSTS[0], sid, libvirt_uri) is None
    assert not guest_dir.exists()


async def test_an_agent_killed_and_back_within_its_lease_leaves_its_guest_running(
    cloud: Cloud, libvirt_uri: str
) -> None:
    host = HOSTS[1]
    sid = create(cloud, "survivor", host)["id"]
    dom = libvirt_domain(node_uuid(cloud, host), sid, libvirt_uri)
    guest_id = dom.ID()

    agent = cloud.processes[host]
    agent.popen.kill()
    agent.popen.wait()
    cloud.start(host, "keel-compute", host, **agent_settings(host))
    await cloud.wait_for_service(host, up=True)

    dom = libvirt_domain(node_uuid(cloud, host), sid, libvirt_uri)
    assert dom.isActive()
    assert dom.ID() == guest_id
    assert (await until_server(cloud, sid, "ACTIVE"))["status"] == "ACTIVE"
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)


async def test_evacuation_boots_a_new_domain_and_the_old_one_goes_once_done(
    cloud: Cloud, libvirt_uri: str
) -> None:
    source, destination = HOSTS
    sid = create(cloud, "mover", source)["id"]
    await console_shows(cloud, sid, 1)
    agent = cloud.processes[source]
    agent.popen.kill()  # its guest keeps running until the host's fence powers it off
    agent.popen.wait()
    service_set(cloud, source, "--down")  # the new copy waits for the fence's lease

    cloud.openstack(
        "--os-compute-api-version", "2.29", "server", "evacuate", "--host", destination, sid,
        as_json=False,
    )  # fmt: skip
    moved = await until_server(cloud, sid, "ACTIVE")
    await until_record(cloud, sid, "done")
    text = await console_shows(cloud, sid, 1)
    old_kept = domain_state(cloud, source, sid, libvirt_uri)
    cloud.start(source, "keel-compute", source, **agent_settings(source))
    await until_record(cloud, sid, "completed")
    service_set(cloud, source, "--up")
    await cloud.wait_for_service(source, up=True)

    assert moved["OS-EXT-SRV-ATTR:host"] == destination
    assert f"keel-guest-up {sid}" in text
    assert old_kept == "off", "fenced before the new copy started"
    assert domain_state(cloud, source, sid, libvirt_uri) is None
    assert domain_state(cloud, destination, sid, libvirt_uri) == "running"
    assert not (cloud.state_dir(source) / "instances" / sid).exists()
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)


def qemu_io(disk: Path, command: str, *, read_only: bool = False) -> str:
    argv = ["qemu-io", *(["-r"] if read_only else []), "-c", command, str(disk)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_cold_migration_copies_the_disk_and_the_guest_boots_there(
    cloud: Cloud, libvirt_uri: str
) -> None:
    source, destination = HOSTS
    sid = create(cloud, "migrant", source)["id"]
    cloud.openstack("server", "stop", sid, as_json=False)
    await until_server(cloud, sid, "SHUTOFF")
    source_disk = cloud.state_dir(source) / "instances" / sid / "disk"
    qemu_io(source_disk, "write -P 0xab 1M 64k")  # data only this guest's disk has

    cloud.openstack(
        "--os-compute-api-version", "2.56", "server", "migrate", "--host", destination, sid,
        as_json=False,
    )  # fmt: skip
    await until_server(cloud, sid, "VERIFY_RESIZE")
    copied = cloud.state_dir(destination) / "instances" / sid / "disk"
    verified = qemu_io(copied, "read -P 0xab 1M 64k", read_only=True)
    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    await until_server(cloud, sid, "SHUTOFF")
    await until_record(cloud, sid, "confirmed")
    cloud.openstack("server", "start", sid, as_json=False)
    await until_server(cloud, sid, "ACTIVE")
    text = await console_shows(cloud, sid, 1)

    assert "Pattern verification failed" not in verified
    assert f"keel-guest-up {sid}" in text
    assert domain_state(cloud, source, sid, libvirt_uri) is None
    assert not source_disk.exists()
    assert domain_state(cloud, destination, sid, libvirt_uri) == "running"
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
