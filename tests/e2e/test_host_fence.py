"""Host fences with real processes and the local driver: never two running copies when an
agent dies.

Two hosts; each agent starts its host's ``keel-fence`` (a process of its own). An agent
is SIGKILLed — its own process only: the host, its guest and its fence run on — and its
server is evacuated, the operator either waiting or forcing the host down at once.
Both hosts' guests (the local driver's ``power`` files) are sampled every 0.2 s
throughout: at no moment do two copies run. The fence's lease is short here (8 s) so the
tests take seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from services.fence.api import FENCE_LOCK, FENCED_FILE, STATUS_FILE, HeldLock
from tests.e2e.cloud import Cloud, CloudConfig
from tests.e2e.moves import SETTLE, evacuate, guest, on, service_set, until_record, until_server
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTS = ("hf-a", "hf-b")
LEASE, MARGIN = 8.0, 1.0


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(
        computes=HOSTS,
        self_fence_after=LEASE,
        env=(("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"), ("KEEL_FENCING__MARGIN", f"{MARGIN:g}")),
    )


def running(cloud: Cloud, host: str, server_id: str) -> bool:
    power = guest(cloud, host, server_id) / "power"
    try:
        return power.read_text().strip() == "running"
    except FileNotFoundError:
        return False


@asynccontextmanager
async def sampled(cloud: Cloud, server_id: str) -> AsyncIterator[list[list[str]]]:
    """Every 0.2 s, the hosts running a copy of the server (checked on the way out)."""
    samples: list[list[str]] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            samples.append([h for h in HOSTS if running(cloud, h, server_id)])
            await asyncio.sleep(0.2)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        stop.set()
        await task
    twice = [s for s in samples if len(s) > 1]
    assert not twice, f"two running copies in {len(twice)} of {len(samples)} samples"


def fence_status(cloud: Cloud, host: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((cloud.state_dir(host) / STATUS_FILE).read_text())
    return data


async def fence_lease(cloud: Cloud, host: str) -> float | None:
    async with cloud.pool.acquire() as conn:
        lease: float | None = await conn.fetchval(
            """SELECT fence_lease FROM services
                WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
            host,
        )
    return lease


def sigkill_agent(cloud: Cloud, host: str) -> None:
    agent = cloud.processes[host]
    agent.popen.kill()
    agent.popen.wait()


@pytest.fixture
async def restored(cloud: Cloud) -> AsyncIterator[None]:
    yield
    for host in HOSTS:
        if cloud.processes[host].popen.poll() is not None:
            cloud.start(host, "keel-compute", host, KEEL_COMPUTE__RECONCILE_INTERVAL="1")
        service_set(cloud, host, "--up")
        await cloud.wait_for_service(host, up=True)


async def armed(cloud: Cloud, host: str) -> None:
    async def check() -> bool:
        return await fence_lease(cloud, host) == LEASE

    await wait_until(check, what=f"{host}'s fence armed", timeout=SETTLE)


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize("force_down", [False, True], ids=["waiting", "forced-down"])
async def test_a_dead_agents_host_is_fenced_before_its_server_runs_elsewhere(
    cloud: Cloud, force_down: bool
) -> None:
    source, destination = HOSTS
    await armed(cloud, source)
    server = await on(cloud, source, f"fenced-{force_down}")
    sid = server["id"]
    async with sampled(cloud, sid):
        sigkill_agent(cloud, source)
        assert running(cloud, source, sid), "the agent's death stops nothing by itself"
        if force_down:
            service_set(cloud, source, "--down")
            evacuate(cloud, sid, destination)  # accepted at once, held for the lease
        else:
            await wait_until(
                lambda: _evacuated(cloud, sid, destination),
                what="the evacuation being accepted once the lease ran out",
                timeout=SETTLE,
            )
        moved = await until_server(cloud, sid, "ACTIVE")
        await until_record(cloud, sid, "done")
    assert moved["OS-EXT-SRV-ATTR:host"] == destination
    assert running(cloud, destination, sid)
    assert not running(cloud, source, sid), "the old copy ends off"
    record = json.loads((cloud.state_dir(source) / FENCED_FILE).read_text())
    assert sid in record["powered_off"]
    assert "fenced: the lease ran out" in cloud.processes[source].read_log()


async def _evacuated(cloud: Cloud, server_id: str, destination: str) -> bool:
    """Ask for the evacuation; True once keel-api accepts it (400 while not fenced)."""
    async with cloud.http(cloud.admin_token) as http:
        response = await http.post(
            f"servers/{server_id}/action",
            json={"evacuate": {"host": destination}},
            headers={"OpenStack-API-Version": "compute 2.29"},
        )
    if response.status_code == 400:
        waiting = ("still in use", "not yet fenced")
        assert any(why in response.text for why in waiting), response.text
        return False
    assert response.status_code == 200, response.text
    return True


@pytest.mark.usefixtures("restored")
async def test_a_fence_killed_is_started_again_and_the_host_is_unarmed_meanwhile(
    cloud: Cloud,
) -> None:
    host = HOSTS[1]
    await armed(cloud, host)
    first = fence_status(cloud, host)["pid"]
    lock = HeldLock(cloud.state_dir(host) / FENCE_LOCK)
    os.kill(first, signal.SIGKILL)
    await wait_until(lambda: _taken(lock), what="the dead fence's lock", timeout=SETTLE)
    try:
        # No fence can start while the lock is held: heartbeats report none.
        await wait_until(
            lambda: _unarmed(cloud, host), what=f"{host} reported unarmed", timeout=SETTLE
        )
    finally:
        lock.release()
    await armed(cloud, host)
    assert fence_status(cloud, host)["pid"] != first
    assert "starting it again" in cloud.processes[host].read_log()


async def _taken(lock: HeldLock) -> bool:
    return lock.acquire()


async def _unarmed(cloud: Cloud, host: str) -> bool:
    return await fence_lease(cloud, host) is None
