"""The libvirt driver against a real libvirtd: guests boot, obey power operations and go."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.image_cache import ImageCache
from services.compute.rpcapi import InstanceSpec
from services.compute.virt.libvirt.connection import LibvirtConnection
from services.compute.virt.libvirt.domain import domain_name
from services.compute.virt.libvirt.driver import LibvirtDriver
from shared.objects.flavor import FlavorSnapshot
from tests.libvirt.images import Served, serve

#: Seconds a guest may take to print its marker (software emulation, shared cores).
BOOT_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def served(guest_images: Path) -> Iterator[Served]:
    with serve(guest_images) as running:
        yield running


def make_driver(uri: str, state: Path) -> LibvirtDriver:
    return LibvirtDriver(
        LibvirtConnection(uri),
        state_dir=state,
        cache=ImageCache(state / "image-cache", cap_bytes=1024**3),
        shutdown_timeout=20,
    )


@pytest.fixture
async def driver(libvirt_uri: str, tmp_path: Path) -> AsyncIterator[LibvirtDriver]:
    made = make_driver(libvirt_uri, tmp_path / "node1")
    await made.init_host(uuid.uuid4())
    yield made
    for guest in await made.list_instances():
        await made.destroy(guest)


def spec_for(served: Served, instance_uuid: UUID | None = None) -> InstanceSpec:
    return InstanceSpec(
        uuid=instance_uuid or uuid.uuid4(),
        display_name="tiny",
        flavor=FlavorSnapshot(flavorid="t", name="keel.tiny", vcpus=1, memory_mb=128, root_gb=1),
        node="node1",
        boot=served.boot(),
    )


async def console_shows(driver: LibvirtDriver, instance_uuid: UUID, count: int) -> str:
    """The console once it shows ``count`` boot markers of the guest (fails after a while)."""
    marker = f"keel-guest-up {instance_uuid}"
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        text = (await driver.console_output(instance_uuid)).decode(errors="replace")
        if text.count(marker) >= count:
            return text
        assert time.monotonic() < deadline, f"no boot {count} of {instance_uuid}:\n{text[-2000:]}"
        await asyncio.sleep(0.5)


async def test_a_guest_boots_with_its_serial_and_obeys_power_operations(
    driver: LibvirtDriver, served: Served
) -> None:
    spec = spec_for(served)

    await driver.spawn(spec)
    await driver.spawn(spec)
    await console_shows(driver, spec.uuid, 1)
    listed = await driver.list_instances()
    await driver.power_off(spec.uuid)
    off = await driver.is_running(spec.uuid)
    await driver.power_on(spec.uuid)
    await console_shows(driver, spec.uuid, 2)
    await driver.reboot(spec.uuid, hard=False)
    await console_shows(driver, spec.uuid, 3)
    await driver.reboot(spec.uuid, hard=True)
    text = await console_shows(driver, spec.uuid, 4)
    await driver.destroy(spec.uuid)
    await driver.destroy(spec.uuid)

    assert listed == [spec.uuid]
    assert off is False
    assert "power button pressed" in text
    assert await driver.list_instances() == []
    assert not driver.guest_dir(spec.uuid).exists()
    name = domain_name(driver.node_uuid, spec.uuid)
    defined = await driver._conn.run(lambda conn: conn.listDefinedDomains())
    assert name not in defined


async def test_two_nodes_on_one_libvirtd_each_see_only_their_own_guests(
    driver: LibvirtDriver, served: Served, libvirt_uri: str, tmp_path: Path
) -> None:
    other = make_driver(libvirt_uri, tmp_path / "node2")
    await other.init_host(uuid.uuid4())
    spec = spec_for(served)
    try:
        await driver.spawn(spec)
        await other.spawn(spec)  # the same server on two nodes, as during an evacuation

        mine, theirs = await driver.list_instances(), await other.list_instances()
        await driver.destroy(spec.uuid)
        left = await other.list_instances()
    finally:
        await other.destroy(spec.uuid)

    assert mine == theirs == [spec.uuid]
    assert left == [spec.uuid]
    assert await other.list_instances() == []


async def test_a_lost_libvirt_connection_is_opened_again(
    driver: LibvirtDriver, caplog: pytest.LogCaptureFixture
) -> None:
    assert await driver.list_instances() == []
    await driver._conn.run(lambda conn: conn.close())

    assert await driver.list_instances() == []
    assert "connection to libvirt at" in caplog.text


async def test_a_guest_without_an_image_to_boot_is_refused(
    driver: LibvirtDriver, served: Served
) -> None:
    spec = spec_for(served).model_copy(update={"boot": None})

    with pytest.raises(Exception, match="carries no image to boot from"):
        await driver.spawn(spec)
    assert await driver.list_instances() == []


async def test_guests_slow_to_shut_down_do_not_hold_up_other_libvirt_calls(
    driver: LibvirtDriver, served: Served
) -> None:
    spec = spec_for(served)
    await driver.spawn(spec)
    # Just started, the guest cannot hear its power button yet: each shutdown waits.
    stopping = [asyncio.create_task(driver.power_off(spec.uuid)) for _ in range(6)]
    await asyncio.sleep(1)

    began = time.monotonic()
    resources = await driver.resources()
    took = time.monotonic() - began
    still_waiting = sum(not task.done() for task in stopping)
    await asyncio.gather(*stopping)

    assert still_waiting == 6
    assert took < 2.0
    assert resources.running_vms == 1
    assert not await driver.is_running(spec.uuid)


async def test_a_guest_pauses_and_is_suspended_and_resumed_from_its_saved_memory(
    driver: LibvirtDriver, served: Served
) -> None:
    spec = spec_for(served)
    await driver.spawn(spec)
    await console_shows(driver, spec.uuid, 1)

    await driver.pause(spec.uuid)
    await driver.pause(spec.uuid)
    paused = await driver.guest_power(spec.uuid)
    await driver.unpause(spec.uuid)
    await driver.unpause(spec.uuid)
    unpaused = await driver.guest_power(spec.uuid)
    await driver.suspend(spec.uuid)
    await driver.suspend(spec.uuid)
    suspended = await driver.guest_power(spec.uuid)
    await driver.resume(spec.uuid)
    resumed = await driver.guest_power(spec.uuid)
    console = (await driver.console_output(spec.uuid)).decode(errors="replace")
    await driver.suspend(spec.uuid)
    await driver.destroy(spec.uuid)

    assert [p.name for p in (paused, unpaused, suspended, resumed)] == [
        "PAUSED",
        "RUNNING",
        "SUSPENDED",
        "RUNNING",
    ]
    # Resumed from its saved memory, not booted again.
    assert console.count(f"keel-guest-up {spec.uuid}") == 1
    # A suspended guest is removed with its saved memory.
    assert await driver.list_instances() == []
