"""Evacuations with real agents and the real CLI: the source destroys only what a record says.

Three hosts with the local driver (guests are directories). A host is "lost" by
stopping its agent and forcing its service down; the server is evacuated with
``openstack server evacuate``; the host then comes back and must clean up exactly what
the migration records allow, and nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from shared.db import allocations
from tests.e2e.cloud import Cloud, CloudConfig, Process
from tests.e2e.moves import (
    SETTLE,
    claimed_on,
    evacuate,
    guest,
    migrations_of,
    on,
    service_set,
    shown,
    until_record,
    until_server,
)
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTS = ("ev-a", "ev-b", "ev-c")
#: Agents report their guests often here, so a returning host acts within seconds.
FAST = {"KEEL_COMPUTE__RECONCILE_INTERVAL": "1"}


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=HOSTS, env=(("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"),))


def lose(cloud: Cloud, host: str) -> None:
    """The host dies: its agent stops and the operator forces its service down."""
    assert cloud.processes[host].stop() == 0
    service_set(cloud, host, "--down")


def come_back(cloud: Cloud, host: str, **settings: str) -> Process:
    return cloud.start(host, "keel-compute", host, **{**FAST, **settings})


async def until_logged(process: Process, text: str) -> None:
    async def check() -> bool:
        return text in process.log.read_text(errors="replace")

    await wait_until(check, what=f"{process.name} logging {text!r}", timeout=SETTLE)


async def heartbeating(cloud: Cloud, host: str) -> None:
    """Until ``host``'s agent heartbeats (forced down or not): it has reported its guests."""

    async def check() -> bool:
        async with cloud.pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    """SELECT last_seen_up > now() - interval '2 seconds' FROM services
                        WHERE host = $1 AND "binary" = 'keel-compute' AND deleted_at IS NULL""",
                    host,
                )
            )

    await wait_until(check, what=f"agent {host} heartbeating", timeout=SETTLE)


async def usage(cloud: Cloud, host: str) -> int:
    async with cloud.pool.acquire() as conn:
        used: int = await conn.fetchval(
            "SELECT memory_mb_used FROM compute_nodes WHERE host = $1 AND deleted_at IS NULL",
            host,
        )
        assert await allocations.usage_drift(conn) == []
    return used


async def force_up(cloud: Cloud, host: str) -> httpx.Response:
    """Unset forced_down for ``host``'s compute service, as the API answers it."""
    headers = {"OpenStack-API-Version": "compute 2.53"}
    found = await cloud.get(f"os-services?host={host}&binary=keel-compute", version="2.53")
    service_id = found["services"][0]["id"]
    async with cloud.http(cloud.admin_token) as http:
        return await http.put(
            f"os-services/{service_id}", json={"forced_down": False}, headers=headers
        )


@pytest.fixture
async def restored(cloud: Cloud) -> AsyncIterator[None]:
    """Every host's agent running, its service enabled and not forced down, after the test."""
    yield
    for host in HOSTS:
        if cloud.processes[host].popen.poll() is not None:
            come_back(cloud, host)
    for host in HOSTS:
        cloud.openstack_raw(
            "compute", "service", "set", "--up", "--enable", host, "keel-compute", as_json=False
        )
        await cloud.wait_for_service(host, up=True)


async def test_evacuation_rebuilds_elsewhere_and_the_source_cleans_up(
    cloud: Cloud, restored: None
) -> None:
    server = await on(cloud, "ev-a", "evac-happy")
    sid = server["id"]
    assert guest(cloud, "ev-a", sid).is_dir()

    refused = cloud.openstack_raw("server", "evacuate", sid, as_json=False)
    assert refused.returncode != 0
    assert "Compute service of ev-a is still in use." in refused.stderr
    assert await migrations_of(cloud, sid) == []

    lose(cloud, "ev-a")
    evacuate(cloud, sid)
    moved = await until_server(cloud, sid, "ACTIVE")
    record = await until_record(cloud, sid, "done")
    dest = moved["OS-EXT-SRV-ATTR:host"]
    assert dest in ("ev-b", "ev-c")
    assert (record["migration_type"], record["source_compute"], record["dest_compute"]) == (
        "evacuation",
        "ev-a",
        dest,
    )
    assert guest(cloud, dest, sid).is_dir()
    too_soon = await force_up(cloud, "ev-a")
    assert too_soon.status_code == 400
    assert "are done but not confirmed by it" in too_soon.text

    agent = come_back(cloud, "ev-a")
    await until_record(cloud, sid, "completed")
    assert not guest(cloud, "ev-a", sid).exists()
    assert f"removed guest {sid}" in agent.log.read_text()
    assert await claimed_on(cloud, sid) == [dest]
    assert await usage(cloud, "ev-a") == 0
    assert (await force_up(cloud, "ev-a")).status_code == 200

    listed = cloud.openstack("server", "migration", "list", "--server", sid)
    assert [m["Type"] for m in listed] == ["evacuation"]
    events = cloud.openstack("server", "event", "list", sid)
    assert {e["Action"] for e in events} >= {"create", "evacuate"}


async def test_no_other_host_leaves_the_server_in_error_on_its_source(
    cloud: Cloud, restored: None
) -> None:
    server = await on(cloud, "ev-a", "evac-nowhere")
    sid = server["id"]
    lose(cloud, "ev-a")
    for other in ("ev-b", "ev-c"):
        service_set(cloud, other, "--disable")
    try:
        evacuate(cloud, sid)
        failed = await until_server(cloud, sid, "ERROR")
    finally:
        for other in ("ev-b", "ev-c"):
            service_set(cloud, other, "--enable")
    assert failed["OS-EXT-SRV-ATTR:host"] == "ev-a"
    assert "No valid host" in failed["fault"]["message"]
    assert (await until_record(cloud, sid, "error"))["dest_compute"] is None

    come_back(cloud, "ev-a")
    # An agent reports its guests before its first heartbeat: by now it has acted.
    await heartbeating(cloud, "ev-a")
    assert guest(cloud, "ev-a", sid).is_dir()
    service_set(cloud, "ev-a", "--up")


async def test_destination_failure_keeps_the_source_copy(cloud: Cloud, restored: None) -> None:
    server = await on(cloud, "ev-a", "evac-fails")
    sid = server["id"]
    assert cloud.processes["ev-b"].stop() == 0
    come_back(cloud, "ev-b", KEEL_VIRT__FAIL_OPERATIONS="rebuild")
    await cloud.wait_for_service("ev-b", up=True)
    lose(cloud, "ev-a")
    evacuate(cloud, sid, "ev-b")
    await until_server(cloud, sid, "ERROR")
    record = await until_record(cloud, sid, "failed")
    assert record["dest_compute"] == "ev-b"
    async with cloud.pool.acquire() as conn:
        held = await conn.fetch(
            """SELECT a.* FROM allocations a JOIN compute_nodes n ON n.id = a.compute_node_id
                WHERE n.host = 'ev-b' AND a.instance_uuid = $1::uuid""",
            sid,
        )
    assert held == []

    come_back(cloud, "ev-a")
    await heartbeating(cloud, "ev-a")
    assert (await shown(cloud, sid))["OS-EXT-SRV-ATTR:host"] == "ev-a"
    assert guest(cloud, "ev-a", sid).is_dir()
    service_set(cloud, "ev-a", "--up")
    assert cloud.processes["ev-b"].stop() == 0
    come_back(cloud, "ev-b")


async def test_source_returning_mid_rebuild_waits_then_cleans_up(
    cloud: Cloud, restored: None
) -> None:
    server = await on(cloud, "ev-a", "evac-slow")
    sid = server["id"]
    assert cloud.processes["ev-b"].stop() == 0
    come_back(cloud, "ev-b", KEEL_VIRT__DELAY_S="8")
    await cloud.wait_for_service("ev-b", up=True)
    lose(cloud, "ev-a")
    evacuate(cloud, sid, "ev-b")
    await until_record(cloud, sid, "pre-migrating")
    agent = come_back(cloud, "ev-a")
    await until_logged(agent, f"keeping guest {sid} and not starting it")
    assert guest(cloud, "ev-a", sid).is_dir()
    await until_record(cloud, sid, "completed")
    assert not guest(cloud, "ev-a", sid).exists()
    assert guest(cloud, "ev-b", sid).is_dir()
    service_set(cloud, "ev-a", "--up")
    assert cloud.processes["ev-b"].stop() == 0
    come_back(cloud, "ev-b")


async def test_two_evacuations_in_a_row_each_host_removes_its_own_copy(
    cloud: Cloud, restored: None
) -> None:
    server = await on(cloud, "ev-a", "evac-twice")
    sid = server["id"]
    lose(cloud, "ev-a")
    evacuate(cloud, sid, "ev-b")
    assert (await until_server(cloud, sid, "ACTIVE"))["OS-EXT-SRV-ATTR:host"] == "ev-b"
    await until_record(cloud, sid, "done")
    lose(cloud, "ev-b")
    evacuate(cloud, sid, "ev-c")

    async def on_c() -> bool:
        return bool((await shown(cloud, sid))["OS-EXT-SRV-ATTR:host"] == "ev-c")

    await wait_until(on_c, what="second evacuation landing on ev-c", timeout=SETTLE)
    await until_server(cloud, sid, "ACTIVE")

    come_back(cloud, "ev-a")
    come_back(cloud, "ev-b")

    async def both_confirmed() -> bool:
        return {m["status"] for m in await migrations_of(cloud, sid)} == {"completed"}

    await wait_until(both_confirmed, what="both evacuations completed", timeout=SETTLE)
    assert not guest(cloud, "ev-a", sid).exists()
    assert not guest(cloud, "ev-b", sid).exists()
    assert guest(cloud, "ev-c", sid).is_dir()
    assert await claimed_on(cloud, sid) == ["ev-c"]
    service_set(cloud, "ev-a", "--up")
    service_set(cloud, "ev-b", "--up")


async def test_a_guest_moved_away_without_a_record_is_an_orphan(
    cloud: Cloud, restored: None
) -> None:
    server = await on(cloud, "ev-a", "evac-orphan")
    sid = server["id"]
    assert cloud.processes["ev-a"].stop() == 0
    async with cloud.pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET compute_id = (SELECT id FROM compute_nodes
                                                  WHERE host = 'ev-b' AND deleted_at IS NULL),
                      host = 'ev-b', node = 'ev-b'
                WHERE uuid = $1::uuid""",
            sid,
        )

    agent = come_back(cloud, "ev-a")
    await until_logged(agent, f"keeping guest {sid} and not starting it: orphaned")
    assert guest(cloud, "ev-a", sid).is_dir()
    listed = cloud.manage("compute", "orphans", "--host", "ev-a")
    assert listed.returncode == 0, listed.stderr
    assert sid in listed.stdout


async def test_a_server_deleted_while_its_agent_was_down_is_removed_at_start_up(
    cloud: Cloud, restored: None
) -> None:
    server = await on(cloud, "ev-c", "deleted-while-down")
    sid = server["id"]
    lose(cloud, "ev-c")
    await cloud.delete_server(sid)
    assert guest(cloud, "ev-c", sid).is_dir()

    agent = come_back(cloud, "ev-c")
    await until_logged(agent, f"removed guest {sid}: its instance was deleted")
    assert not guest(cloud, "ev-c", sid).exists()
    service_set(cloud, "ev-c", "--up")
