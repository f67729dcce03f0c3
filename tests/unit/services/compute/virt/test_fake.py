"""The fake driver, and the factory that picks a driver from the settings."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.compute.virt import FakeDriver, LocalDriver, load_driver
from shared.config import ComputeSettings, Settings
from shared.exceptions import GuestNotFound
from tests.unit.services.compute.standin import make_spec


async def test_fake_driver_keeps_guests_in_memory() -> None:
    driver = FakeDriver("fake1", vcpus=4, memory_mb=2048, local_gb=40)
    first, second = make_spec(), make_spec()

    await driver.spawn(first)
    await driver.spawn(second)
    await driver.spawn(first)

    assert sorted(await driver.list_instances()) == sorted([first.uuid, second.uuid])
    totals = await driver.resources()
    assert (totals.vcpus, totals.memory_mb, totals.local_gb, totals.running_vms) == (
        4,
        2048,
        40,
        2,
    )
    assert driver.guest(first.uuid) == first

    await driver.destroy(first.uuid)
    await driver.destroy(uuid.uuid4())

    assert await driver.list_instances() == [second.uuid]
    assert driver.guest(first.uuid) is None
    assert (await driver.resources()).running_vms == 1


async def test_fake_driver_with_spawn_delay_still_builds() -> None:
    driver = FakeDriver("fake1", spawn_delay=0.01)
    spec = make_spec()

    await driver.spawn(spec)

    assert await driver.list_instances() == [spec.uuid]
    assert driver.hypervisor_hostname() == "fake1"


def test_factory_defaults_to_the_local_driver(tmp_path: Path) -> None:
    settings = Settings(host="node-a", state_dir=tmp_path)

    driver = load_driver(settings)

    assert isinstance(driver, LocalDriver)
    assert driver.state_dir == tmp_path
    assert driver.hypervisor_hostname() == "node-a"


async def test_factory_builds_a_sized_fake_driver(tmp_path: Path) -> None:
    settings = Settings(
        host="node-b",
        state_dir=tmp_path,
        compute=ComputeSettings(driver="fake", vcpus=2, memory_mb=1024),
    )

    driver = load_driver(settings)

    assert isinstance(driver, FakeDriver)
    totals = await driver.resources()
    assert (totals.vcpus, totals.memory_mb, totals.local_gb) == (
        2,
        1024,
        FakeDriver.DEFAULT_LOCAL_GB,
    )


async def test_fake_console_shows_each_boot_and_power_off() -> None:
    driver = FakeDriver("fake1")
    spec = make_spec()
    marker = f"keel-guest-up {spec.uuid}"
    await driver.spawn(spec)
    booted = (await driver.console_output(spec.uuid)).decode()

    await driver.power_off(spec.uuid)
    await driver.power_on(spec.uuid)
    await driver.power_on(spec.uuid)
    await driver.reboot(spec.uuid, hard=False)
    log = (await driver.console_output(spec.uuid)).decode()

    assert booted.count(marker) == 1
    assert len(booted.splitlines()) >= 10
    assert [line.split("] ", 1)[1] for line in log[len(booted) :].splitlines()] == [
        "powered off",
        marker,
        "soft reboot",
        marker,
    ]
    await driver.destroy(spec.uuid)
    with pytest.raises(GuestNotFound):
        await driver.console_output(spec.uuid)
