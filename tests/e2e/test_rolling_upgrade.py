"""A rolling upgrade with real processes: agents of release 1 beside a newer control plane.

The control plane runs this release; agents start as release 1
(``KEEL_EMULATE_SERVICE_VERSION=1``) and are upgraded in place one by one. The compute
RPC version follows the oldest agent: the conductor logs its automatic choice, builds
leave out what release-1 agents do not know (for every agent, old or new), server
actions that release 1 lacks are refused naming the old host, and once every agent is
upgraded a SIGHUP (the cache TTL here is an hour) moves the pin to the latest.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from typing import Any
from uuid import UUID

import pytest

from shared.versions import SERVICE_VERSION, apis_for
from tests.e2e.cloud import BIN, Cloud, CloudConfig, Process, free_port
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LATEST = apis_for(SERVICE_VERSION).compute
SETTLE = 60.0
#: Agents keep their guests on disk (the local driver), so they survive an upgrade.
OLD = {"KEEL_EMULATE_SERVICE_VERSION": "1"}
NEW: dict[str, str] = {}


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    # No agents at start; the pins are cached for an hour, so only SIGHUP moves them.
    return CloudConfig(computes=(), env=(("KEEL_SERVICE_VERSION_CACHE_TTL", "3600"),))


async def up(cloud: Cloud, host: str) -> None:
    async def check() -> bool:
        async with cloud.pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    """SELECT last_seen_up > now() - interval '2 seconds' FROM services
                        WHERE host = $1 AND "binary" = 'keel-compute'
                          AND deleted_at IS NULL""",
                    host,
                )
            )

    await wait_until(check, what=f"agent {host} reporting up", timeout=SETTLE)


async def create(cloud: Cloud, name: str, host: str | None = None) -> UUID:
    """A new server (requested on ``host`` if given); its id, without waiting."""
    return UUID((await cloud.post_server(name, host=host))["id"])


async def settled(cloud: Cloud, server_id: UUID, status: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def check() -> bool:
        async with cloud.http(cloud.admin_token) as client:
            response = await client.get(f"servers/{server_id}")
        found.update(response.json()["server"])
        return bool(found["status"] == status)

    await wait_until(check, what=f"server {server_id} reaching {status}", timeout=SETTLE)
    return found


async def logged(process: Process, text: str) -> None:
    async def check() -> bool:
        return text in process.log.read_text(errors="replace")

    await wait_until(check, what=f"{process.name} logging {text!r}", timeout=SETTLE)


def build_line(process: Process, server_id: UUID) -> str:
    for line in process.log.read_text(errors="replace").splitlines():
        if f"building guest {server_id}" in line:
            return line
    raise AssertionError(f"{process.name} never built {server_id}")


def agent(cloud: Cloud, host: str, env: dict[str, str]) -> Process:
    if host in cloud.processes:
        cloud.processes[host].stop()
    return cloud.start(host, "keel-compute", host, **env)


async def test_a_release1_agent_joining_an_empty_cloud_sets_the_next_build_to_1_0(
    cloud: Cloud,
) -> None:
    agent(cloud, "compute-a", OLD)
    await up(cloud, "compute-a")

    server_id = await create(cloud, "first")
    await settled(cloud, server_id, "ACTIVE")

    await logged(
        cloud.processes["conductor"],
        "Automatically selected compute RPC version 1.0 from minimum service version 1",
    )
    assert "addresses: none given" in build_line(cloud.processes["compute-a"], server_id)


async def test_mixed_release_then_upgrade_in_place_then_sighup(cloud: Cloud) -> None:
    agent(cloud, "compute-b", OLD)
    await up(cloud, "compute-b")
    on_b = await create(cloud, "on-b", "compute-b")
    server = await settled(cloud, on_b, "ACTIVE")
    assert server["OS-EXT-SRV-ATTR:host"] == "compute-b"

    # B is upgraded in place; A still runs release 1, so the pin stays at 1.0 for all.
    agent(cloud, "compute-b", NEW)
    await up(cloud, "compute-b")
    again_on_b = await create(cloud, "again-on-b", "compute-b")
    server = await settled(cloud, again_on_b, "ACTIVE")
    assert server["OS-EXT-SRV-ATTR:host"] == "compute-b"
    assert "addresses: none given" in build_line(cloud.processes["compute-b"], again_on_b)

    refused = cloud.openstack_raw("server", "stop", str(on_b), as_json=False)
    assert refused.returncode != 0
    assert "compute-a (release arbor)" in refused.stderr
    assert await settled(cloud, on_b, "ACTIVE")

    # A is upgraded too; with an hour-long cache only SIGHUP lets the pin rise.
    agent(cloud, "compute-a", NEW)
    await up(cloud, "compute-a")
    assert cloud.openstack_raw("server", "stop", str(on_b), as_json=False).returncode != 0
    for name in ("conductor", "api"):
        cloud.processes[name].popen.send_signal(signal.SIGHUP)
        await logged(
            cloud.processes[name],
            f"Automatically selected compute RPC version {LATEST} from minimum service "
            f"version {SERVICE_VERSION}",
        )

    cloud.openstack("server", "stop", str(on_b), as_json=False)
    assert (await settled(cloud, on_b, "SHUTOFF"))["OS-EXT-STS:power_state"] == 4
    cloud.openstack("server", "start", str(on_b), as_json=False)
    await settled(cloud, on_b, "ACTIVE")
    cloud.openstack("server", "reboot", "--soft", "--wait", str(on_b), as_json=False)
    await settled(cloud, on_b, "ACTIVE")
    cloud.openstack("server", "reboot", "--hard", "--wait", str(on_b), as_json=False)
    server = await settled(cloud, on_b, "ACTIVE")
    assert server["OS-EXT-STS:power_state"] == 1

    latest = await create(cloud, "latest")
    server = await settled(cloud, latest, "ACTIVE")
    host = server["OS-EXT-SRV-ATTR:host"]
    assert "addresses: 10." in build_line(cloud.processes[host], latest)


#: What a refusal must leave as it was (heartbeats keep moving the rest).
ROWS = 'SELECT id, uuid, host, "binary", version, deleted_at FROM services ORDER BY id'


async def test_a_stale_agent_is_refused_and_leaves_no_rows(cloud: Cloud) -> None:
    async with cloud.pool.acquire() as conn:
        before = await conn.fetch(ROWS)
        nodes = await conn.fetchval("SELECT count(*) FROM compute_nodes")

    stale = agent(cloud, "compute-stale", OLD)
    code = await asyncio.to_thread(stale.popen.wait, SETTLE)

    assert code == 1
    assert (
        f"This service is older (v1) than the minimum (v{SERVICE_VERSION}) version of the rest "
        "of the deployment. Unable to continue."
    ) in stale.tail()
    assert "Traceback" not in stale.tail()
    async with cloud.pool.acquire() as conn:
        assert await conn.fetch(ROWS) == before
        assert await conn.fetchval("SELECT count(*) FROM compute_nodes") == nodes


@pytest.mark.parametrize("binary", ["keel-conductor", "keel-scheduler", "keel-api"])
async def test_control_plane_refuses_to_start_beside_too_old_computes(
    cloud: Cloud, binary: str
) -> None:
    async with cloud.pool.acquire() as conn:
        await conn.execute(
            """INSERT INTO services (uuid, host, "binary", topic, version)
               VALUES (gen_random_uuid(), 'ancient', 'keel-compute', 'compute', 0)"""
        )
    try:
        async with cloud.pool.acquire() as conn:
            before = await conn.fetch(ROWS)
        env = {
            **cloud.env,
            "KEEL_HOST": f"refused-{binary}",
            "KEEL_API_BIND": f"127.0.0.1:{free_port()}",
        }
        refused = await asyncio.to_thread(_run, [str(BIN / binary)], env)
        assert refused.returncode == 1, refused.stderr
        assert "ancient (v0)" in refused.stderr
        assert "Traceback" not in refused.stderr
        async with cloud.pool.acquire() as conn:
            assert await conn.fetch(ROWS) == before

        allowed = cloud.start(
            f"ffu-{binary}",
            binary,
            f"ffu-{binary}",
            KEEL_WORKAROUNDS__DISABLE_COMPUTE_SERVICE_CHECK_FOR_FFU="true",
            KEEL_API_BIND=f"127.0.0.1:{free_port()}",
        )
        await logged(allowed, "starts anyway")
        assert allowed.popen.poll() is None
        assert allowed.stop() == 0
    finally:
        async with cloud.pool.acquire() as conn:
            await conn.execute("DELETE FROM services WHERE host = 'ancient'")


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=SETTLE, check=False
    )
