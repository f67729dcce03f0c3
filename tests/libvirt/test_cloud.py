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
from tests.e2e.cloud import Cloud
from tests.e2e.moves import service_set, until_record, until_server
from tests.libvirt.cloud import FLAVOR, HOSTS, libvirt_cloud
from tests.libvirt.cloud import agent_settings as cloud_settings
from tests.libvirt.guests import free_port, make_key, ssh_run

BOOT_TIMEOUT = 60.0
#: Each agent's SSH forward port: the two share this machine, and an evacuated server's
#: new guest runs beside its old one (same address, so another port).
FORWARD_PORTS = {host: free_port() for host in HOSTS}


def agent_settings(host: str) -> dict[str, str]:
    return cloud_settings(host, FORWARD_PORTS)


@pytest.fixture(scope="module")
async def cloud(
    guest_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cloud]:
    workdir = tmp_path_factory.mktemp("libvirt-cloud")
    async with libvirt_cloud(workdir, guest_images, FORWARD_PORTS) as running:
        yield running


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


def create(cloud: Cloud, name: str, host: str, *options: str, wait: bool = True) -> dict[str, Any]:
    server: dict[str, Any] = cloud.openstack(
        "--os-compute-api-version", "2.74", "server", "create", "--flavor", FLAVOR,
        "--image", "keel-test", "--host", host, *(["--wait"] if wait else []), *options, name,
    )  # fmt: skip
    if wait:
        assert server["status"] == "ACTIVE", server
    return server


@pytest.fixture(scope="module")
def keypair(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The key pair ``k`` (imported, as ``openstack keypair create --public-key``): its
    private key's file."""
    private, _ = make_key(tmp_path_factory.mktemp("keys"), "tier-key")
    cloud.openstack("keypair", "create", "--public-key", f"{private}.pub", "k")
    return private


def forward_of(cloud: Cloud, server_id: str) -> str:
    """The loopback address the server's SSH is forwarded from, as the server shows it."""
    addresses = cloud.openstack("server", "show", server_id)["addresses"]
    [address] = addresses["forwarded"]
    return str(address)


async def console_line(cloud: Cloud, server_id: str, text: str) -> str:
    """The console log once it shows ``text``."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        log: str = cloud.openstack("console", "log", "show", server_id, as_json=False)
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{text!r} not seen on {server_id}:\n{log}"
        await asyncio.sleep(1)


async def test_ssh_with_the_key_pair_reaches_servers_that_read_a_config_drive_or_the_service(
    cloud: Cloud, keypair: Path, tmp_path: Path
) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho user-data-says-$(hostname)\n")
    host = HOSTS[0]
    common = ("--key-name", "k", "--user-data", str(script))
    drive = create(cloud, "drive-vm", host, *common, "--config-drive", "true", wait=False)
    service = create(cloud, "service-vm", host, *common, wait=False)
    found = {}
    for server, source in ((drive, "config-drive"), (service, "metadata-service")):
        active = await until_server(cloud, server["id"], "ACTIVE")
        log = await console_line(cloud, server["id"], f"user-data-says-{active['name']}")
        forward = forward_of(cloud, server["id"])
        name = await ssh_run(forward, FORWARD_PORTS[host], keypair, "hostname")
        found[source] = (active, log, name.strip())
    for server in (drive, service):
        cloud.openstack("server", "delete", "--wait", server["id"], as_json=False)

    for source, (active, log, name) in found.items():
        assert name == active["name"]
        assert f"keel-guest-source {source}" in log
        assert "keel-guest-key tier-key" in log
        [fixed] = active["addresses"]["private"]
        assert f"keel-guest-ip {fixed['addr']}" in log
    assert found["config-drive"][0]["config_drive"] == "True"
    assert found["metadata-service"][0]["config_drive"] == ""


async def test_a_rebuild_makes_the_guest_again_with_its_new_key_pair_and_user_data(
    cloud: Cloud, keypair: Path, tmp_path: Path, libvirt_uri: str
) -> None:
    host = HOSTS[0]
    server = create(cloud, "rebuilt-vm", host, "--key-name", "k")
    sid = server["id"]
    await console_line(cloud, sid, "keel-guest-key tier-key")
    addresses = (await until_server(cloud, sid, "ACTIVE"))["addresses"]
    private, _ = make_key(tmp_path, "rebuild-key")
    cloud.openstack("keypair", "create", "--public-key", f"{private}.pub", "k2")
    script = tmp_path / "rebuilt.sh"
    script.write_text("#!/bin/sh\necho rebuilt-says-$(hostname)\n")

    cloud.openstack(
        "--os-compute-api-version", "2.57", "server", "rebuild", "--image", "keel-test",
        "--name", "rebuilt-vm2", "--key-name", "k2", "--user-data", str(script), sid,
    )  # fmt: skip
    active = await until_server(cloud, sid, "ACTIVE")
    # The guest keeps the host name the server was given at create time (as in Nova
    # since 2.90): a rename by the rebuild changes the server's name only.
    log = await console_line(cloud, sid, "rebuilt-says-rebuilt-vm")
    name = await ssh_run(forward_of(cloud, sid), FORWARD_PORTS[host], private, "hostname")
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
    cloud.openstack("keypair", "delete", "k2", as_json=False)
    gone = domain_state(cloud, host, sid, libvirt_uri)

    assert name.strip() == "rebuilt-vm"
    assert active["name"] == "rebuilt-vm2"
    assert active["key_name"] == "k2"
    assert active["addresses"] == addresses
    assert "keel-guest-key rebuild-key" in log
    assert "keel-guest-key tier-key" not in log
    assert gone is None


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


async def test_agents_stopped_and_killed_leave_their_guest_running_and_networked(
    cloud: Cloud, libvirt_uri: str, keypair: Path
) -> None:
    host = HOSTS[1]
    sid = create(cloud, "survivor", host, "--key-name", "k")["id"]
    dom = libvirt_domain(node_uuid(cloud, host), sid, libvirt_uri)
    guest_id = dom.ID()
    forward, port = forward_of(cloud, sid), FORWARD_PORTS[host]
    ask_metadata = "timeout 5 wget -q -O - http://169.254.169.254/openstack/latest/meta_data.json"
    before = await ssh_run(forward, port, keypair, "hostname")

    answers = []
    for stop in ("terminate", "kill"):  # SIGTERM, then SIGKILL
        agent = cloud.processes[host]
        getattr(agent.popen, stop)()
        agent.popen.wait()
        answers.append(await ssh_run(forward, port, keypair, "hostname"))
        cloud.start(host, "keel-compute", host, **agent_settings(host))
        await cloud.wait_for_service(host, up=True)
        answers.append(await ssh_run(forward, port, keypair, ask_metadata))

    dom = libvirt_domain(node_uuid(cloud, host), sid, libvirt_uri)
    assert dom.isActive()
    assert dom.ID() == guest_id
    assert (await until_server(cloud, sid, "ACTIVE"))["status"] == "ACTIVE"
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
    assert before.strip() == "survivor"
    while_stopped, after_restart, while_killed, after_kill = answers
    assert while_stopped.strip() == while_killed.strip() == "survivor"
    assert f'"uuid": "{sid}"' in after_restart
    assert f'"uuid": "{sid}"' in after_kill


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
