"""The local driver: each guest a directory with a sparse disk and its metadata."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest

from services.compute.rpcapi import InstanceSpec
from services.compute.virt import local
from services.compute.virt.driver import MAX_CONSOLE_BYTES
from services.compute.virt.local import GIB, LocalDriver
from shared.exceptions import BuildFailed, GuestNotFound
from shared.objects.network import FixedIp, mac_address
from tests.unit.services.compute.standin import make_spec


@pytest.fixture
def driver(tmp_path: Path) -> LocalDriver:
    return LocalDriver(tmp_path, "host1")


def _entries(driver: LocalDriver) -> list[str]:
    return sorted(p.name for p in driver.instances_dir.iterdir())


async def test_spawn_creates_directory_with_sparse_disk_and_metadata(driver: LocalDriver) -> None:
    spec = make_spec(root_gb=20)

    await driver.spawn(spec)

    guest = driver.state_dir / "instances" / str(spec.uuid)
    disk = (guest / "disk").stat()
    assert disk.st_size == 20 * GIB
    assert disk.st_blocks * 512 < GIB
    metadata = InstanceSpec.model_validate_json((guest / "metadata.json").read_text())
    assert metadata == spec
    assert _entries(driver) == [str(spec.uuid)]
    assert await driver.list_instances() == [spec.uuid]


async def test_the_guest_metadata_carries_addresses_metadata_and_user_data(
    driver: LocalDriver,
) -> None:
    network_id = uuid.uuid4()
    address = FixedIp(
        network_id=network_id,
        network_name="private",
        address="10.0.0.2",
        mac=mac_address(network_id, "10.0.0.2"),
    )
    spec = make_spec().model_copy(
        update={"addresses": [address], "metadata": {"role": "web"}, "user_data": "aGk="}
    )

    await driver.spawn(spec)

    written = json.loads((driver.guest_dir(spec.uuid) / "metadata.json").read_text())
    assert written["addresses"] == [
        {
            "network_id": str(network_id),
            "network_name": "private",
            "address": "10.0.0.2",
            "mac": address.mac,
            "version": 4,
            "tag": None,
            "cidr": None,
        }
    ]
    assert written["metadata"] == {"role": "web"}
    assert written["user_data"] == "aGk="


async def test_spawn_is_idempotent(driver: LocalDriver) -> None:
    spec = make_spec(name="first")
    await driver.spawn(spec)

    await driver.spawn(spec.model_copy(update={"display_name": "second"}))

    metadata = InstanceSpec.model_validate_json(
        (driver.guest_dir(spec.uuid) / "metadata.json").read_text()
    )
    assert metadata.display_name == "first"
    assert _entries(driver) == [str(spec.uuid)]


async def test_concurrent_spawns_of_one_guest_leave_one_whole_guest(driver: LocalDriver) -> None:
    spec = make_spec()

    await asyncio.gather(*(driver.spawn(spec) for _ in range(5)))

    assert _entries(driver) == [str(spec.uuid)]
    assert sorted(p.name for p in driver.guest_dir(spec.uuid).iterdir()) == [
        "console.log",
        "disk",
        "metadata.json",
        "power",
    ]


async def test_failed_write_leaves_nothing_that_looks_like_a_guest(
    driver: LocalDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_guest = local._write_guest

    def write_then_run_out_of_space(directory: Path, spec: InstanceSpec, hypervisor: str) -> None:
        write_guest(directory, spec, hypervisor)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local, "_write_guest", write_then_run_out_of_space)
    spec = make_spec()

    with pytest.raises(BuildFailed, match="No space left on device"):
        await driver.spawn(spec)

    assert _entries(driver) == []
    assert await driver.list_instances() == []


async def test_destroy_removes_the_guest(driver: LocalDriver) -> None:
    keep, remove = make_spec(), make_spec()
    await driver.spawn(keep)
    await driver.spawn(remove)

    await driver.destroy(remove.uuid)

    assert not driver.guest_dir(remove.uuid).exists()
    assert await driver.list_instances() == [keep.uuid]
    assert _entries(driver) == [str(keep.uuid)]


async def test_destroy_of_a_missing_guest_is_fine(driver: LocalDriver) -> None:
    await driver.destroy(uuid.uuid4())
    await driver.spawn(make_spec())

    await driver.destroy(uuid.uuid4())

    assert len(await driver.list_instances()) == 1


async def test_destroy_sweeps_scratch_left_by_a_crashed_build(driver: LocalDriver) -> None:
    spec = make_spec()
    scratch = driver.instances_dir / f".building-{spec.uuid}-abc123"
    scratch.mkdir(parents=True)
    (scratch / "disk").touch()

    await driver.destroy(spec.uuid)

    assert _entries(driver) == []


async def test_list_ignores_scratch_and_foreign_entries(driver: LocalDriver) -> None:
    spec = make_spec()
    await driver.spawn(spec)
    (driver.instances_dir / f".building-{uuid.uuid4()}-x").mkdir()
    (driver.instances_dir / "lost+found").mkdir()
    (driver.instances_dir / str(uuid.uuid4())).touch()

    assert await driver.list_instances() == [spec.uuid]


async def test_init_host_sweeps_scratch_and_keeps_guests(driver: LocalDriver) -> None:
    spec = make_spec()
    await driver.spawn(spec)
    (driver.instances_dir / f".building-{uuid.uuid4()}-x").mkdir()
    (driver.instances_dir / f".deleting-{uuid.uuid4()}-y").mkdir()

    await driver.init_host(uuid.uuid4())

    assert _entries(driver) == [str(spec.uuid)]


async def test_resources_from_settings_count_guests(tmp_path: Path) -> None:
    driver = LocalDriver(tmp_path, "host1", vcpus=8, memory_mb=16384, local_gb=500)
    await driver.spawn(make_spec())
    await driver.spawn(make_spec())

    totals = await driver.resources()

    assert (totals.vcpus, totals.memory_mb, totals.local_gb) == (8, 16384, 500)
    assert totals.running_vms == 2


async def test_resources_measured_when_not_set(tmp_path: Path) -> None:
    driver = LocalDriver(tmp_path / "not-yet-created", "host1")

    totals = await driver.resources()

    assert totals.vcpus == os.cpu_count()
    assert totals.memory_mb > 0
    assert totals.local_gb == os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize // GIB
    assert totals.running_vms == 0


def test_hypervisor_hostname_is_the_configured_host(driver: LocalDriver) -> None:
    assert driver.hypervisor_hostname() == "host1"


async def test_console_shows_the_boot_and_every_power_change(driver: LocalDriver) -> None:
    spec = make_spec()
    await driver.spawn(spec)
    marker = f"keel-guest-up {spec.uuid}"

    booted = (await driver.console_output(spec.uuid)).decode()
    await driver.power_off(spec.uuid)
    await driver.power_off(spec.uuid)
    await driver.power_on(spec.uuid)
    await driver.reboot(spec.uuid, hard=False)
    await driver.reboot(spec.uuid, hard=True)
    after = (await driver.console_output(spec.uuid)).decode()

    assert booted.count(marker) == 1
    assert len(booted.splitlines()) >= 10
    assert after.startswith(booted)
    changes = [line.split("] ", 1)[1] for line in after[len(booted) :].splitlines()]
    assert changes == ["powered off", marker, "soft reboot", marker, "hard reboot", marker]


async def test_soft_reboot_of_a_guest_that_is_off_shows_nothing(driver: LocalDriver) -> None:
    spec = make_spec()
    await driver.spawn(spec)
    await driver.power_off(spec.uuid)
    before = await driver.console_output(spec.uuid)

    await driver.reboot(spec.uuid, hard=False)

    assert await driver.console_output(spec.uuid) == before
    assert driver.power_state(spec.uuid) == "shutdown"


async def test_console_of_a_missing_guest_is_guest_not_found(driver: LocalDriver) -> None:
    with pytest.raises(GuestNotFound):
        await driver.console_output(uuid.uuid4())


async def test_console_returns_only_the_end_of_a_long_log(driver: LocalDriver) -> None:
    spec = make_spec()
    await driver.spawn(spec)
    log = driver.guest_dir(spec.uuid) / "console.log"
    with log.open("ab") as stream:
        stream.write(b"x" * MAX_CONSOLE_BYTES + b"\nlast line\n")

    output = await driver.console_output(spec.uuid)

    assert len(output) == MAX_CONSOLE_BYTES
    assert output.endswith(b"x\nlast line\n")
