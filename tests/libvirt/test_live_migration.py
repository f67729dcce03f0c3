"""Live migration with the libvirt driver: a running guest moves between two libvirtd.

lv-a's agent uses the system daemon, lv-b's the tier's second daemon
(:mod:`tests.libvirt.second_daemon`, ``KEEL_LIBVIRT__URI``), so libvirt moves the guest
for real (memory and disk over 127.0.0.1), driven with the stock client. Migrations from
lv-b are slowed (``KEEL_LIBVIRT__MIGRATION_BANDWIDTH_MIB``) so that one can be aborted.
Both daemons' domains are sampled throughout: never two running copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cloud import Cloud
from tests.e2e.moves import until_record, until_server
from tests.libvirt import second_daemon
from tests.libvirt.cloud import HOSTS, libvirt_cloud
from tests.libvirt.cloud import agent_settings as cloud_settings
from tests.libvirt.guests import free_port, make_key, ssh_run
from tests.libvirt.test_cloud import console_line, create, forward_of
from tests.polling import wait_until

FORWARD_PORTS = {host: free_port() for host in HOSTS}
V = ("--os-compute-api-version", "2.30")
#: MiB/s of a migration from lv-b: slow enough to abort one.
SLOW_MIB = 1


@pytest.fixture(scope="module")
def daemon(libvirt_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with second_daemon.running(tmp_path_factory.mktemp("second-libvirtd")) as running:
        yield running


@pytest.fixture(scope="module")
async def cloud(
    guest_images: Path, tmp_path_factory: pytest.TempPathFactory, daemon: Any
) -> AsyncIterator[Cloud]:
    workdir = tmp_path_factory.mktemp("libvirt-live-cloud")
    lv_b = {
        "KEEL_LIBVIRT__URI": daemon.uri,
        "KEEL_LIBVIRT__MIGRATION_BANDWIDTH_MIB": str(SLOW_MIB),
    }
    async with libvirt_cloud(
        workdir, guest_images, FORWARD_PORTS, host_settings={"lv-b": lv_b}
    ) as running:
        yield running


@pytest.fixture(scope="module")
def keypair(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> Path:
    private, _ = make_key(tmp_path_factory.mktemp("keys"), "live-key")
    cloud.openstack("keypair", "create", "--public-key", f"{private}.pub", "k")
    return private


def _states(uri: str, server_id: str) -> list[str]:
    """The states of ``uri``'s domains of the server: running, paused, off."""
    import libvirt  # noqa: PLC0415

    conn = libvirt.open(uri)
    try:
        found = []
        for dom in conn.listAllDomains(0):
            try:
                if not dom.name().endswith(server_id):
                    continue
                code = dom.state()[0]
            except libvirt.libvirtError:
                continue  # gone meanwhile
            names = {libvirt.VIR_DOMAIN_RUNNING: "running", libvirt.VIR_DOMAIN_PAUSED: "paused"}
            found.append(names.get(code, "off"))
        return found
    finally:
        conn.close()


def running_on(uris: dict[str, str], server_id: str) -> list[str]:
    return [host for host, uri in uris.items() for s in _states(uri, server_id) if s == "running"]


@contextlib.asynccontextmanager
async def never_two_running(uris: dict[str, str], server_id: str) -> AsyncIterator[None]:
    seen: list[list[str]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(running_on(uris, server_id))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
    assert len(seen) > 20
    assert max(len(s) for s in seen) <= 1, [s for s in seen if len(s) > 1][:3]


async def uptime(cloud: Cloud, server_id: str, host: str, key: Path) -> float:
    out = await ssh_run(forward_of(cloud, server_id), FORWARD_PORTS[host], key, "cat /proc/uptime")
    return float(out.split()[0])


def unthrottle(uri: str, server_id: str) -> None:
    """The server's migration out of ``uri`` at full speed from now on."""
    import libvirt  # noqa: PLC0415

    conn = libvirt.open(uri)
    try:
        for dom in conn.listAllDomains(0):
            if dom.name().endswith(server_id):
                dom.migrateSetMaxSpeed(8192, 0)
    finally:
        conn.close()


def live_migrate(cloud: Cloud, server_id: str, host: str) -> None:
    cloud.openstack(
        *V, "server", "migrate", "--live-migration", "--host", host, server_id, as_json=False
    )


async def test_a_running_guest_moves_live_and_keeps_its_uptime(
    cloud: Cloud, keypair: Path, libvirt_uri: str, daemon: Any
) -> None:
    uris = {"lv-a": libvirt_uri, "lv-b": daemon.uri}
    server = create(cloud, "live-vm", "lv-a", "--key-name", "k")
    sid = server["id"]
    await console_line(cloud, sid, "keel-guest-key live-key")
    before = await uptime(cloud, sid, "lv-a", keypair)

    async with never_two_running(uris, sid):
        cloud.openstack(
            *V, "server", "migrate", "--live-migration", "--host", "lv-b", "--wait", sid,
            as_json=False,
        )  # fmt: skip
        record = await until_record(cloud, sid, "completed")
        await wait_until(
            lambda: asyncio.sleep(0, result=_states(libvirt_uri, sid) == []),
            what="the source's domain removed",
            timeout=30,
        )
    moved = await until_server(cloud, sid, "ACTIVE")
    after = await uptime(cloud, sid, "lv-b", keypair)
    console = cloud.openstack("console", "log", "show", sid, as_json=False)

    assert (record["source_compute"], record["dest_compute"]) == ("lv-a", "lv-b")
    assert moved["OS-EXT-SRV-ATTR:host"] == "lv-b"
    assert running_on(uris, sid) == ["lv-b"]
    # The same boot: the guest's clock went on across the move.
    assert after > before
    assert console.count(f"keel-guest-up {sid}") <= 1
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)


async def test_an_aborted_live_migration_leaves_the_guest_running_on_its_source(
    cloud: Cloud, keypair: Path, libvirt_uri: str, daemon: Any
) -> None:
    uris = {"lv-a": libvirt_uri, "lv-b": daemon.uri}
    server = create(cloud, "abort-vm", "lv-b", "--key-name", "k")
    sid = server["id"]
    await console_line(cloud, sid, "keel-guest-key live-key")
    before = await uptime(cloud, sid, "lv-b", keypair)

    async with never_two_running(uris, sid):
        live_migrate(cloud, sid, "lv-a")
        number: list[int] = []

        async def copying() -> bool:
            found = await cloud.get(f"servers/{sid}/migrations", version="2.24")
            running = [
                m
                for m in found["migrations"]
                if m["status"] == "running" and m["memory_processed_bytes"]
            ]
            number[:] = [m["id"] for m in running]
            return bool(running)

        await wait_until(copying, what="the live migration copying", timeout=60)
        cloud.openstack(
            "--os-compute-api-version", "2.24", "server", "migration", "abort", sid,
            str(number[0]), as_json=False,
        )  # fmt: skip
        await until_record(cloud, sid, "cancelled")
        await wait_until(
            lambda: asyncio.sleep(0, result=_states(libvirt_uri, sid) == []),
            what="the destination's domain gone",
            timeout=60,
        )
    active = await until_server(cloud, sid, "ACTIVE")
    after = await uptime(cloud, sid, "lv-b", keypair)
    prepared = cloud.state_dir("lv-a") / "instances" / sid

    async def removed() -> bool:
        return not prepared.exists()

    await wait_until(removed, what="the destination's prepared files removed", timeout=30)

    assert active["OS-EXT-SRV-ATTR:host"] == "lv-b"
    assert running_on(uris, sid) == ["lv-b"]
    assert after > before
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)


async def test_the_destination_agent_killed_mid_copy_takes_the_guest_when_it_is_back(
    cloud: Cloud, keypair: Path, libvirt_uri: str, daemon: Any
) -> None:
    """libvirt's copy needs no destination agent; the switch-over waits for it to be back
    (within its fence lease), and the guest goes on there: one copy running throughout."""
    uris = {"lv-a": libvirt_uri, "lv-b": daemon.uri}
    server = create(cloud, "agent-vm", "lv-b", "--key-name", "k")
    sid = server["id"]
    await console_line(cloud, sid, "keel-guest-key live-key")
    before = await uptime(cloud, sid, "lv-b", keypair)

    async with never_two_running(uris, sid):
        live_migrate(cloud, sid, "lv-a")

        async def copying() -> bool:
            found = await cloud.get(f"servers/{sid}/migrations", version="2.24")
            return any(
                m["status"] == "running" and m["memory_processed_bytes"]
                for m in found["migrations"]
            )

        await wait_until(copying, what="the live migration copying", timeout=60)
        agent = cloud.processes["lv-a"]
        agent.popen.kill()
        agent.popen.wait()
        await asyncio.sleep(3)
        cloud.start("lv-a", "keel-compute", "lv-a", **cloud_settings("lv-a", FORWARD_PORTS))
        await asyncio.to_thread(unthrottle, daemon.uri, sid)
        record = await until_record(cloud, sid, "completed")
        await wait_until(
            lambda: asyncio.sleep(0, result=_states(daemon.uri, sid) == []),
            what="the source's domain removed",
            timeout=60,
        )
    active = await until_server(cloud, sid, "ACTIVE")
    after = await uptime(cloud, sid, "lv-a", keypair)

    assert record["dest_compute"] == "lv-a"
    assert active["OS-EXT-SRV-ATTR:host"] == "lv-a"
    assert running_on(uris, sid) == ["lv-a"]
    assert after > before
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)


async def test_the_destination_daemon_killed_mid_copy_leaves_the_guest_running_on_its_source(
    cloud: Cloud, keypair: Path, libvirt_uri: str, daemon: Any
) -> None:
    """Last in this module: lv-b's daemon does not come back."""
    import libvirt  # noqa: PLC0415

    server = create(cloud, "crash-vm", "lv-a", "--key-name", "k")
    sid = server["id"]
    await console_line(cloud, sid, "keel-guest-key live-key")
    before = await uptime(cloud, sid, "lv-a", keypair)
    # Slow this guest's next migration (lv-a's agent sets no limit of its own).
    conn = libvirt.open(libvirt_uri)
    try:
        [dom] = [d for d in conn.listAllDomains(0) if d.name().endswith(sid)]
        dom.migrateSetMaxSpeed(SLOW_MIB, 0)
    finally:
        conn.close()

    live_migrate(cloud, sid, "lv-b")

    async def copying() -> bool:
        found = await cloud.get(f"servers/{sid}/migrations", version="2.24")
        return any(
            m["status"] == "running" and m["memory_processed_bytes"] for m in found["migrations"]
        )

    await wait_until(copying, what="the live migration copying", timeout=60)
    second_daemon.kill(daemon)

    record = await until_record(cloud, sid, "failed")
    active = await until_server(cloud, sid, "ACTIVE")
    after = await uptime(cloud, sid, "lv-a", keypair)

    assert record["dest_compute"] == "lv-b"
    assert active["OS-EXT-SRV-ATTR:host"] == "lv-a"
    assert _states(libvirt_uri, sid) == ["running"]
    assert after > before
    cloud.openstack("server", "delete", "--wait", sid, as_json=False)
