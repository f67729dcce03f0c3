"""Guests' interfaces under the libvirt driver: user-mode networking and its forwards."""

from __future__ import annotations

import asyncio
import base64
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from services.compute.image_cache import ImageCache
from services.compute.rpcapi import InstanceSpec
from services.compute.virt.libvirt import config_drive
from services.compute.virt.libvirt.connection import LibvirtConnection
from services.compute.virt.libvirt.driver import LibvirtDriver
from services.compute.virt.libvirt.interface import NetworkConfig
from services.compute.virt.libvirt.metadata_relay import MetadataRelay
from shared.guest_metadata import signature
from shared.objects.flavor import FlavorSnapshot
from shared.objects.network import FixedIp, forward_address
from tests.libvirt.guests import (
    LINE_TIMEOUT,
    StandInMetadata,
    fixed_ip,
    free_port,
    make_key,
    random_network,
    ssh_banner,
    ssh_run,
)
from tests.libvirt.images import Served, serve


@pytest.fixture(scope="module")
def served(guest_images: Path) -> Iterator[Served]:
    with serve(guest_images) as running:
        yield running


@pytest.fixture
async def driver(libvirt_uri: str, tmp_path: Path) -> AsyncIterator[LibvirtDriver]:
    made = LibvirtDriver(
        LibvirtConnection(libvirt_uri),
        state_dir=tmp_path / "node",
        cache=ImageCache(tmp_path / "node" / "image-cache", cap_bytes=1024**3),
        shutdown_timeout=10,
        network=NetworkConfig(mode="user", ssh_forward_port=free_port()),
    )
    await made.init_host(uuid.uuid4())
    yield made
    for guest in await made.list_instances():
        await made.destroy(guest)


def spec(fixed: FixedIp, served: Served, name: str, **fields: Any) -> InstanceSpec:
    return InstanceSpec(
        uuid=uuid.uuid4(),
        display_name=name,
        flavor=FlavorSnapshot(flavorid="t", name="keel.tiny", vcpus=1, memory_mb=128, root_gb=1),
        node="node",
        addresses=[fixed],
        boot=served.boot(),
        **fields,
    )


async def console_line(driver: LibvirtDriver, instance_uuid: UUID, pattern: str) -> str:
    """The first console line matching ``pattern`` (fails after a while)."""
    deadline = time.monotonic() + LINE_TIMEOUT
    while True:
        text = (await driver.console_output(instance_uuid)).decode(errors="replace")
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            return found.group(0).strip()
        assert time.monotonic() < deadline, f"no line {pattern!r}:\n{text[-2000:]}"
        await asyncio.sleep(0.5)


async def test_a_guest_gets_its_fixed_address_and_its_ssh_is_forwarded_from_loopback(
    driver: LibvirtDriver, served: Served
) -> None:
    network = random_network()
    fixed = fixed_ip(network, 7)
    spec = InstanceSpec(
        uuid=uuid.uuid4(),
        display_name="netted",
        flavor=FlavorSnapshot(flavorid="t", name="keel.tiny", vcpus=1, memory_mb=128, root_gb=1),
        node="node",
        addresses=[fixed],
        boot=served.boot(),
    )

    await driver.spawn(spec)
    address = await console_line(driver, spec.uuid, r"^keel-guest-ip .*$")
    banner = await ssh_banner(forward_address(fixed.address), driver.network.ssh_forward_port)

    assert address == f"keel-guest-ip {fixed.address}"
    assert banner.startswith(b"SSH-2.0-dropbear")


async def test_a_config_drive_gives_the_guest_its_name_key_and_user_data(
    driver: LibvirtDriver, served: Served, tmp_path: Path
) -> None:
    fixed = fixed_ip(random_network(), 9)
    key, public = make_key(tmp_path, "drive-key")
    script = b"#!/bin/sh\necho user-data-ran-$(hostname)\n"
    spec = InstanceSpec(
        uuid=uuid.uuid4(),
        display_name="Drive_Test",
        flavor=FlavorSnapshot(flavorid="t", name="keel.tiny", vcpus=1, memory_mb=128, root_gb=1),
        node="node",
        addresses=[fixed],
        boot=served.boot(),
        key_name="k",
        key_data=public,
        config_drive=True,
        user_data=base64.b64encode(script).decode(),
    )

    await driver.spawn(spec)
    ran = await console_line(driver, spec.uuid, r"^user-data-ran-.*$")
    console = (await driver.console_output(spec.uuid)).decode(errors="replace")
    host, port = forward_address(fixed.address), driver.network.ssh_forward_port
    name = await ssh_run(host, port, key, "hostname")

    assert "keel-guest-source config-drive" in console
    assert "keel-guest-hostname drive-test" in console
    assert f"keel-guest-ip {fixed.address}" in console
    assert "keel-guest-key drive-key" in console
    assert ran == "user-data-ran-drive-test"
    assert name.strip() == "drive-test"


def spoofing_script(own: str, other: InstanceSpec, other_signature: str) -> bytes:
    """User data asking the metadata service as itself, then with another server's headers
    (even their right signature), then from that server's address (then taking its own
    address back)."""
    url = "http://169.254.169.254/openstack/latest/meta_data.json"
    uuid_of = 'grep -o \'"uuid": "[^"]*"\''
    other_address = other.addresses[0].address
    return f"""#!/bin/sh
echo "asked-as-itself $(wget -q -O - {url} | {uuid_of})"
echo "asked-as-other $(wget -q -O - --header 'X-Instance-ID: {other.uuid}' \\
    --header 'X-Instance-ID-Signature: {other_signature}' {url} | {uuid_of})"
ip addr flush dev eth0
ip addr add {other_address}/24 dev eth0
ip route add default dev eth0
echo "asked-from-other-address $(wget -q -O - {url} | {uuid_of})"
ip addr flush dev eth0
ip addr add {own}/24 dev eth0
ip route add default dev eth0
""".encode()


async def test_the_metadata_service_alone_serves_the_guest_and_nothing_of_another(
    libvirt_uri: str, served: Served, tmp_path: Path
) -> None:
    network, secret = random_network(), "metadata-secret-0123456789"
    key, public = make_key(tmp_path, "service-key")
    other = spec(fixed_ip(network, 11), served, "other", metadata={"secret": "not-yours"})
    guest = spec(fixed_ip(network, 12), served, "asker", key_name="k", key_data=public)
    script = spoofing_script(guest.addresses[0].address, other, signature(secret, str(other.uuid)))
    guest = guest.model_copy(update={"user_data": base64.b64encode(script).decode()})
    guests = {str(s.uuid): config_drive.guest_info(s) for s in (other, guest)}

    with StandInMetadata(secret, guests) as service:
        driver = LibvirtDriver(
            LibvirtConnection(libvirt_uri),
            state_dir=tmp_path / "node",
            cache=ImageCache(tmp_path / "node" / "image-cache", cap_bytes=1024**3),
            shutdown_timeout=10,
            network=NetworkConfig(mode="user", ssh_forward_port=free_port()),
            metadata=MetadataRelay(tmp_path / "node", service.url, secret),
        )
        await driver.init_host(uuid.uuid4())
        try:
            await driver.spawn(guest)
            await console_line(driver, guest.uuid, r"^asked-from-other-address.*$")
            console = (await driver.console_output(guest.uuid)).decode(errors="replace")
            forward = forward_address(guest.addresses[0].address)
            name = await ssh_run(forward, driver.network.ssh_forward_port, key, "hostname")
        finally:
            await driver.destroy(guest.uuid)

    assert "keel-guest-source metadata-service" in console
    assert "keel-guest-hostname asker" in console
    assert "keel-guest-key service-key" in console
    assert name.strip() == "asker"
    own = f'"uuid": "{guest.uuid}"'
    assert f"asked-as-itself {own}" in console
    assert f"asked-as-other {own}" in console
    assert f"asked-from-other-address {own}" in console
    assert str(other.uuid) not in console
    assert "not-yours" not in console
