"""Guests' interfaces under the libvirt driver: user-mode networking and its forwards."""

from __future__ import annotations

import asyncio
import base64
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.image_cache import ImageCache
from services.compute.rpcapi import InstanceSpec
from services.compute.virt.libvirt.connection import LibvirtConnection
from services.compute.virt.libvirt.driver import LibvirtDriver
from services.compute.virt.libvirt.interface import NetworkConfig
from shared.objects.flavor import FlavorSnapshot
from shared.objects.network import forward_address
from tests.libvirt.guests import (
    LINE_TIMEOUT,
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
