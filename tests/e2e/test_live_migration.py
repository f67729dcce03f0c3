"""Live migration with real agents (local driver) and the stock ``openstack`` CLI:
``server migrate --live-migration [--host]``, ``server migration list``, ``abort`` and
``force complete`` (its ``show`` swaps its two arguments, so the progress is read from
the API). A sampler reads both agents' guest directories all along: never two running
copies of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.e2e.cloud import Cloud, CloudConfig
from tests.e2e.moves import claimed_on, guest, on, shown, until_record, until_server
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTS = ("lm-a", "lm-b")
#: The simulated copy: long enough to abort or force-complete it in flight.
COPY_SECONDS = 20
V = ("--os-compute-api-version", "2.30")


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(
        computes=HOSTS,
        env=(
            ("KEEL_COMPUTE__LIVE_MIGRATION_SECONDS", str(COPY_SECONDS)),
            ("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"),
        ),
    )


def power(cloud: Cloud, host: str, server_id: str) -> str | None:
    """The guest's power on ``host`` (``None``: no guest there)."""
    where = guest(cloud, host, server_id)
    if not where.is_dir():
        return None
    found = where / "power"
    try:
        return found.read_text().strip() if found.exists() else "running"
    except FileNotFoundError:
        return None


def running_copies(cloud: Cloud, server_id: str) -> list[str]:
    return [h for h in HOSTS if power(cloud, h, server_id) == "running"]


@contextlib.asynccontextmanager
async def never_two_running(cloud: Cloud, server_id: str) -> AsyncIterator[None]:
    """Sample in a thread of its own: the CLI calls block the test's event loop."""
    seen: list[list[str]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(running_copies(cloud, server_id))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
    assert len(seen) > 20
    assert max(len(s) for s in seen) <= 1, [s for s in seen if len(s) > 1][:3]


def live_migrate(cloud: Cloud, server_id: str, *host: str) -> None:
    args = ["--host", host[0]] if host else []
    cloud.openstack(*V, "server", "migrate", "--live-migration", *args, server_id, as_json=False)


async def in_flight(cloud: Cloud, server_id: str) -> dict[str, Any]:
    """The server's live migration once it is copying (polled through the API: the CLI
    takes seconds to start, and the copy is short)."""
    number: list[int] = []

    async def copying() -> bool:
        found = await cloud.get(f"servers/{server_id}/migrations", version="2.24")
        running = [
            m
            for m in found["migrations"]
            if m["status"] == "running" and m["memory_processed_bytes"]
        ]
        number[:] = [m["id"] for m in running]
        return bool(running)

    await wait_until(copying, what=f"live migration of {server_id} copying", timeout=60)
    # The stock client's ``server migration show`` sends the server and the migration
    # the wrong way round (its SDK call takes them in the other order): read it here.
    shown_one: dict[str, Any] = (
        await cloud.get(f"servers/{server_id}/migrations/{number[0]}", version="2.24")
    )["migration"]
    return shown_one


async def test_live_migration_moves_the_running_server_with_one_running_copy(
    cloud: Cloud,
) -> None:
    server = await on(cloud, "lm-a", "lm-move")
    sid = server["id"]

    async with never_two_running(cloud, sid):
        live_migrate(cloud, sid)
        record = await until_record(cloud, sid, "completed")
        await wait_until(
            lambda: asyncio.sleep(0, result=power(cloud, "lm-a", sid) is None),
            what="the source's copy removed",
            timeout=30,
        )

    assert (record["migration_type"], record["source_compute"], record["dest_compute"]) == (
        "live-migration",
        "lm-a",
        "lm-b",
    )
    moved = await shown(cloud, sid)
    assert (moved["status"], moved["OS-EXT-SRV-ATTR:host"]) == ("ACTIVE", "lm-b")
    assert running_copies(cloud, sid) == ["lm-b"]
    assert await claimed_on(cloud, sid) == ["lm-b"]
    events = cloud.openstack("server", "event", "list", sid)
    assert "live-migration" in {e["Action"] for e in events}

    # And back, to a named host.
    async with never_two_running(cloud, sid):
        live_migrate(cloud, sid, "lm-a")
        await wait_until(
            lambda: asyncio.sleep(0, result=running_copies(cloud, sid) == ["lm-a"]),
            what="the server running on lm-a again",
            timeout=60,
        )
    back = await until_server(cloud, sid, "ACTIVE")
    assert back["OS-EXT-SRV-ATTR:host"] == "lm-a"
    await cloud.delete_server(sid)


async def test_abort_in_flight_leaves_the_server_on_its_source(cloud: Cloud) -> None:
    server = await on(cloud, "lm-a", "lm-abort")
    sid = server["id"]

    async with never_two_running(cloud, sid):
        live_migrate(cloud, sid, "lm-b")
        migration = await in_flight(cloud, sid)
        assert migration["memory_total_bytes"] > 0
        assert migration["memory_remaining_bytes"] > 0
        cloud.openstack(
            "--os-compute-api-version", "2.24", "server", "migration", "abort", sid,
            str(migration["id"]), as_json=False,
        )  # fmt: skip
        await until_record(cloud, sid, "cancelled")
        await wait_until(
            lambda: asyncio.sleep(0, result=running_copies(cloud, sid) == ["lm-a"]),
            what="the source's guest resumed",
            timeout=30,
        )

    active = await until_server(cloud, sid, "ACTIVE")
    assert active["OS-EXT-SRV-ATTR:host"] == "lm-a"
    assert power(cloud, "lm-b", sid) is None
    assert await claimed_on(cloud, sid) == ["lm-a"]
    await cloud.delete_server(sid)


async def test_force_complete_in_flight_finishes_at_once(cloud: Cloud) -> None:
    server = await on(cloud, "lm-b", "lm-force")
    sid = server["id"]

    async with never_two_running(cloud, sid):
        live_migrate(cloud, sid, "lm-a")
        migration = await in_flight(cloud, sid)
        cloud.openstack(
            "--os-compute-api-version", "2.24", "server", "migration", "force", "complete",
            sid, str(migration["id"]), as_json=False,
        )  # fmt: skip
        record = await until_record(cloud, sid, "completed")

    assert record["dest_compute"] == "lm-a"
    assert (await shown(cloud, sid))["OS-EXT-SRV-ATTR:host"] == "lm-a"
    await cloud.delete_server(sid)


async def test_bad_live_migrations_are_refused_and_change_nothing(cloud: Cloud) -> None:
    server = await on(cloud, "lm-a", "lm-refused")
    sid = server["id"]

    for host, message in (("lm-zz", "could not be found"), ("lm-a", "current host")):
        refused = cloud.openstack_raw(
            *V, "server", "migrate", "--live-migration", "--host", host, sid, as_json=False
        )
        assert refused.returncode != 0
        assert message in refused.stderr
    cloud.openstack("server", "stop", sid, as_json=False)
    await until_server(cloud, sid, "SHUTOFF")
    stopped = cloud.openstack_raw(*V, "server", "migrate", "--live-migration", sid, as_json=False)
    assert stopped.returncode != 0
    assert "409" in stopped.stderr or "vm_state" in stopped.stderr
    assert await claimed_on(cloud, sid) == ["lm-a"]
    await cloud.delete_server(sid)
