"""The tier's second libvirtd: a domain moves live from the system daemon to it and back.

This is libvirt's own migration, driven with its API (no keel): the guest is built by the
libvirt driver under the system daemon, then moved into a directory of its own (the
base image hard-linked, an empty overlay to receive the disk over NBD, as each agent's
guest directory is its own), its memory and disk sent over 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.compute.virt.libvirt.driver import LibvirtDriver
from tests.libvirt import second_daemon
from tests.libvirt.images import Served, serve
from tests.libvirt.test_driver import console_shows, make_driver, spec_for


@pytest.fixture(scope="module")
def served(guest_images: Path) -> Iterator[Served]:
    with serve(guest_images) as running:
        yield running


@pytest.fixture(scope="module")
def daemon(libvirt_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with second_daemon.running(tmp_path_factory.mktemp("second-libvirtd")) as running:
        yield running


@pytest.fixture
async def driver(libvirt_uri: str, tmp_path: Path) -> AsyncIterator[LibvirtDriver]:
    made = make_driver(libvirt_uri, tmp_path / "node1")
    await made.init_host(uuid.uuid4())
    yield made
    for guest in await made.list_instances():
        await made.destroy(guest)


def _state(conn: Any, name: str) -> str:
    import libvirt  # noqa: PLC0415

    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        return "absent"
    code = dom.state()[0]
    return {
        libvirt.VIR_DOMAIN_RUNNING: "running",
        libvirt.VIR_DOMAIN_PAUSED: "paused",
        libvirt.VIR_DOMAIN_SHUTOFF: "shut off",
    }.get(code, str(code))


def _receive_into(source: Path, target: Path) -> None:
    """``target`` made ready to take the guest of ``source``: its read-only files
    linked, a fresh overlay of the same base and size for the disk copy."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("base", "kernel", "ramdisk"):
        if not (target / name).exists():
            os.link(source / name, target / name)
    (target / "disk").unlink(missing_ok=True)
    size = json.loads(
        subprocess.run(
            ["qemu-img", "info", "-U", "--output=json", str(source / "disk")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )["virtual-size"]
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", "base", "disk",
         str(size)],
        cwd=target,
        check=True,
    )  # fmt: skip


def _move(source: Any, target: Any, name: str, from_dir: Path, to_dir: Path) -> None:
    """Managed (not peer-to-peer) live migration: the system daemon listens on no TCP
    port, so the client holds both connections and the daemons' QEMUs meet on 127.0.0.1;
    the overlay goes over NBD (its base is on both sides)."""
    import libvirt  # noqa: PLC0415

    _receive_into(from_dir, to_dir)
    dom = source.lookupByName(name)
    xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE).replace(str(from_dir), str(to_dir))
    flags = (
        libvirt.VIR_MIGRATE_LIVE
        | libvirt.VIR_MIGRATE_PERSIST_DEST
        | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
        | libvirt.VIR_MIGRATE_NON_SHARED_INC
    )
    params = {
        libvirt.VIR_MIGRATE_PARAM_URI: "tcp://127.0.0.1",
        libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS: "127.0.0.1",
        libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml,
        libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS: ["vda"],
    }
    dom.migrate3(target, params, flags)


async def test_a_domain_moves_live_to_the_second_daemon_and_back(
    driver: LibvirtDriver, served: Served, libvirt_uri: str, daemon: Any, tmp_path: Path
) -> None:
    import libvirt  # noqa: PLC0415

    spec = spec_for(served)
    await driver.spawn(spec)
    await console_shows(driver, spec.uuid, 1)
    name = f"keel-{driver.node_uuid.hex[:8]}-{spec.uuid}"
    system = libvirt.open(libvirt_uri)
    second = libvirt.open(daemon.uri)
    try:
        uuids = {system.getCapabilities().count(str(daemon.host_uuid))}

        home = driver.guest_dir(spec.uuid)
        away = tmp_path / "away"
        await asyncio.to_thread(_move, system, second, name, home, away)
        there = (_state(system, name), _state(second, name))
        await asyncio.to_thread(_move, second, system, name, away, home)
        back = (_state(system, name), _state(second, name))
    finally:
        second.close()
        system.close()
    console = await console_shows(driver, spec.uuid, 1)

    assert uuids == {0}  # two hosts to libvirt
    assert there == ("absent", "running")
    assert back == ("running", "absent")
    # The same boot throughout: moved, not restarted.
    assert console.count(f"keel-guest-up {spec.uuid}") == 1
    assert await driver.is_running(spec.uuid)
