"""Moves that never lose a copy, with real agents and the real CLI.

Three hosts with the local driver (guests are directories). Each case is an acceptance
line of the moves work: a server evacuated away and then moved back to its first host
keeps its new copy there through restarts and periodic reconciles and is counted once;
a host that never returns is deleted with nothing left claimed on it; deleting a server
during a slowed cold migration leaves nothing behind; a destination agent SIGKILLed
mid-move is ended by the move deadline, and its server is not started on its source until
that destination is known to be off.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from collections.abc import AsyncIterator

import pytest

from tests.e2e.cloud import Cloud, CloudConfig, Process
from tests.e2e.moves import (
    SETTLE,
    claimed_on,
    evacuate,
    guest,
    migrate,
    on,
    service_set,
    shown,
    until_record,
    until_server,
)
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

HOSTS = ("mv-a", "mv-b", "mv-c")
#: Agents report their guests every second here, so periodic reconciles happen often.
RECONCILE = ("KEEL_COMPUTE__RECONCILE_INTERVAL", "1")
TINY_MB = 512
#: The move deadline the conductor runs with in the SIGKILL case.
MOVE_TIMEOUT = 30


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=HOSTS, env=(RECONCILE,))


def lose(cloud: Cloud, host: str) -> None:
    """The host dies: its agent stops and the operator forces its service down."""
    assert cloud.processes[host].stop() == 0
    service_set(cloud, host, "--down")


def come_back(cloud: Cloud, host: str, **settings: str) -> Process:
    return cloud.start(host, "keel-compute", host, **settings)


async def back_up(cloud: Cloud, host: str) -> None:
    """The host's agent runs again and its service is up (not forced down)."""
    if cloud.processes[host].exit_code() is not None:
        come_back(cloud, host)
    cloud.openstack_raw(
        "compute", "service", "set", "--up", "--enable", host, "keel-compute", as_json=False
    )
    await cloud.wait_for_service(host, up=True)


async def used_mb(cloud: Cloud, host: str) -> int:
    async with cloud.pool.acquire() as conn:
        used: int = await conn.fetchval(
            "SELECT memory_mb_used FROM compute_nodes WHERE host = $1 AND deleted_at IS NULL",
            host,
        )
    return used


async def reconciled(cloud: Cloud, host: str, rounds: int = 3) -> None:
    """Let ``host``'s agent report its guests ``rounds`` more times (one a second here)."""
    await asyncio.sleep(rounds * 1.5)
    await cloud.wait_for_service(host, up=True)


@pytest.fixture
async def restored(cloud: Cloud) -> AsyncIterator[None]:
    yield
    for host in HOSTS:
        await back_up(cloud, host)


async def evacuated_away_and_back(cloud: Cloud, name: str) -> str:
    """A server on mv-a, evacuated to mv-b; mv-a returns and cleans up; mv-b then dies."""
    sid = str((await on(cloud, "mv-a", name))["id"])
    lose(cloud, "mv-a")
    evacuate(cloud, sid, "mv-b")
    await until_server(cloud, sid, "ACTIVE")
    await until_record(cloud, sid, "done")
    come_back(cloud, "mv-a")
    await until_record(cloud, sid, "completed")
    assert not guest(cloud, "mv-a", sid).exists()
    service_set(cloud, "mv-a", "--up")
    await cloud.wait_for_service("mv-a", up=True)
    assert await claimed_on(cloud, sid) == ["mv-b"]
    return sid


async def survives_on_a(cloud: Cloud, sid: str, *, claims: tuple[str, ...] = ("mv-a",)) -> None:
    """The copy on mv-a is the server: it survives restarts and reconciles, counted once.

    ``claims``: the hosts holding its claims (a dead source keeps one until it returns).
    """
    assert guest(cloud, "mv-a", sid).is_dir()
    await reconciled(cloud, "mv-a")
    assert cloud.processes["mv-a"].stop() == 0
    come_back(cloud, "mv-a")
    await cloud.wait_for_service("mv-a", up=True)
    await reconciled(cloud, "mv-a")
    assert guest(cloud, "mv-a", sid).is_dir()
    assert (await shown(cloud, sid))["status"] == "ACTIVE"
    assert (await shown(cloud, sid))["OS-EXT-SRV-ATTR:host"] == "mv-a"
    assert await claimed_on(cloud, sid) == list(claims)
    assert await used_mb(cloud, "mv-a") == TINY_MB
    assert "removed guest" not in cloud.processes["mv-a"].read_log().split(sid)[-1]


async def test_evacuated_back_to_its_first_host_the_server_stays_there(
    cloud: Cloud, restored: None
) -> None:
    sid = await evacuated_away_and_back(cloud, "mv-evac-back")

    lose(cloud, "mv-b")
    evacuate(cloud, sid, "mv-a")
    moved = await until_server(cloud, sid, "ACTIVE")
    assert moved["OS-EXT-SRV-ATTR:host"] == "mv-a"
    await until_record(cloud, sid, "done")

    await survives_on_a(cloud, sid, claims=("mv-a", "mv-b"))
    come_back(cloud, "mv-b")
    await until_record(cloud, sid, "completed")
    assert not guest(cloud, "mv-b", sid).exists()
    await survives_on_a(cloud, sid)
    await cloud.delete_server(sid)


async def test_migrated_back_to_its_first_host_and_confirmed_the_server_stays_there(
    cloud: Cloud, restored: None
) -> None:
    sid = await evacuated_away_and_back(cloud, "mv-migr-back")

    migrate(cloud, sid, "mv-a")
    await until_server(cloud, sid, "VERIFY_RESIZE")
    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    await until_record(cloud, sid, "confirmed")
    await until_server(cloud, sid, "ACTIVE")
    assert not guest(cloud, "mv-b", sid).exists()

    await survives_on_a(cloud, sid)
    await cloud.delete_server(sid)


async def test_a_host_that_never_returns_is_deleted_with_nothing_left_claimed(
    cloud: Cloud, restored: None
) -> None:
    sid = str((await on(cloud, "mv-c", "mv-gone"))["id"])
    lose(cloud, "mv-c")
    evacuate(cloud, sid, "mv-b")
    await until_server(cloud, sid, "ACTIVE")
    await until_record(cloud, sid, "done")
    assert await claimed_on(cloud, sid) == ["mv-b", "mv-c"]
    found = await cloud.get("os-services?host=mv-c&binary=keel-compute", version="2.53")
    service_id = found["services"][0]["id"]
    # A host is deleted only once its heartbeat is stale (it was up moments ago).
    await cloud.wait_for_service("mv-c", up=False)
    async with cloud.pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET last_seen_up = now() - interval '1 hour',
                                   registered_at = now() - interval '1 hour'
                WHERE host = 'mv-c' AND "binary" = 'keel-compute'"""
        )

    cloud.openstack(
        "--os-compute-api-version", "2.53", "compute", "service", "delete", service_id,
        as_json=False,
    )  # fmt: skip

    assert await claimed_on(cloud, sid) == ["mv-b"]
    assert (await until_record(cloud, sid, "done"))["source_compute"] == "mv-c"
    async with cloud.pool.acquire() as conn:
        left = await conn.fetchval(
            """SELECT count(*) FROM allocations a JOIN compute_nodes n ON n.id = a.compute_node_id
                WHERE n.host = 'mv-c'"""
        )
    assert left == 0
    code, log = cloud.run_agent("mv-c", cloud.state_dir("mv-c"), timeout=SETTLE)
    assert code == 1
    assert "was deleted" in log
    await cloud.delete_server(sid)
    # The next tests get a fresh mv-c: a new identity on a new node, no old guests.
    shutil.rmtree(cloud.state_dir("mv-c"))
    come_back(cloud, "mv-c")
    await cloud.wait_for_service("mv-c", up=True)


async def test_deleting_a_server_during_a_slowed_cold_migration_leaves_nothing(
    cloud: Cloud, restored: None
) -> None:
    sid = str((await on(cloud, "mv-a", "mv-delete-during"))["id"])
    assert cloud.processes["mv-b"].stop() == 0
    come_back(cloud, "mv-b", KEEL_VIRT__DELAY_S="8")
    await cloud.wait_for_service("mv-b", up=True)

    migrate(cloud, sid, "mv-b")
    await until_record(cloud, sid, "pre-migrating")
    await cloud.delete_server(sid)

    async def settled() -> bool:
        records = await cloud.get(f"os-migrations?instance_uuid={sid}", version="2.59")
        status = records["migrations"][0]["status"] if records["migrations"] else "none"
        return (
            status in ("cancelled", "confirmed", "error")
            and not guest(cloud, "mv-a", sid).exists()
            and not guest(cloud, "mv-b", sid).exists()
        )

    await wait_until(settled, what=f"both copies of {sid} gone", timeout=SETTLE)
    assert await claimed_on(cloud, sid) == []
    assert await used_mb(cloud, "mv-a") == 0
    assert await used_mb(cloud, "mv-b") == 0
    assert cloud.processes["mv-b"].stop() == 0
    come_back(cloud, "mv-b")


@pytest.mark.parametrize("fenced", [False, True], ids=["no-fence", "fence"])
async def test_a_destination_killed_mid_move_is_ended_by_the_move_deadline(
    cloud: Cloud, restored: None, fenced: bool
) -> None:
    """mv-b dies while it builds the copy; the move's deadline ends the move. With an armed
    fence on mv-b its lease runs out and its copy is off: the server runs on mv-a again.
    Without one (fencing off), the copy may run: the server stays shut off on mv-a, and
    starting it is refused until an operator says mv-b is off."""
    assert cloud.processes["conductor"].stop() == 0
    cloud.start("conductor", "keel-conductor", KEEL_MOVE_TIMEOUT=str(MOVE_TIMEOUT))
    # mv-a's heartbeats went unanswered while the conductor was replaced.
    await cloud.wait_for_service("mv-a", up=True)
    sid = str((await on(cloud, "mv-a", f"mv-killed-dest-{fenced}"))["id"])
    assert cloud.processes["mv-b"].stop() == 0
    fencing = {} if fenced else {"KEEL_FENCING__SELF_FENCE_AFTER": "0"}
    come_back(cloud, "mv-b", KEEL_VIRT__DELAY_S="300", **fencing)
    await cloud.wait_for_service("mv-b", up=True)
    try:
        migrate(cloud, sid, "mv-b")
        await until_record(cloud, sid, "pre-migrating")
        began = time.monotonic()
        await asyncio.sleep(2)  # the destination is rebuilding (slowed)
        destination = cloud.processes["mv-b"]
        destination.popen.send_signal(signal.SIGKILL)
        destination.popen.wait()

        async def ended() -> bool:
            server = await shown(cloud, sid)
            return server["OS-EXT-STS:task_state"] is None

        await wait_until(ended, what="the move deadline", timeout=MOVE_TIMEOUT + 60)
        took = time.monotonic() - began
        record = await until_record(cloud, sid, "error")
        assert record["dest_compute"] == "mv-b"
        assert await claimed_on(cloud, sid) == ["mv-a"]
        assert took < MOVE_TIMEOUT + 60
        if fenced:
            # mv-b's fence powered its copy off when the lease ran out: mv-a runs again.
            server = await until_server(cloud, sid, "ACTIVE")
            assert server["OS-EXT-SRV-ATTR:host"] == "mv-a"
            return
        # mv-b's agent is dead and its host has no armed fence: the copy it may have
        # started there may run, so the server stays shut off on mv-a...
        server = await shown(cloud, sid)
        assert (server["status"], server["OS-EXT-SRV-ATTR:host"]) == ("SHUTOFF", "mv-a")
        refused = cloud.openstack_raw("server", "start", sid, as_json=False)
        assert refused.returncode != 0
        assert "may still run" in refused.stderr
        # ...until the operator says mv-b is off.
        service_set(cloud, "mv-b", "--down")
        cloud.openstack("server", "start", sid, as_json=False)
        await until_server(cloud, sid, "ACTIVE")
        assert (await shown(cloud, sid))["OS-EXT-SRV-ATTR:host"] == "mv-a"
    finally:
        cloud.processes["conductor"].stop()
        cloud.start("conductor", "keel-conductor")
        if cloud.processes["mv-b"].popen.poll() is not None:
            come_back(cloud, "mv-b")
        service_set(cloud, "mv-b", "--up")
        await cloud.wait_for_service("mv-b", up=True)
        await cloud.delete_server(sid)


async def test_resize_with_the_cli_confirm_and_revert(cloud: Cloud, restored: None) -> None:
    """`openstack server resize --flavor`, then `resize confirm`; again, then `revert`."""
    sid = str((await on(cloud, "mv-a", "mv-resized"))["id"])

    cloud.openstack("server", "resize", "--flavor", "m1.small", sid, as_json=False)
    waiting = await until_server(cloud, sid, "VERIFY_RESIZE")
    assert waiting["flavor"]["original_name"] == "m1.small"
    moved_to = waiting["OS-EXT-SRV-ATTR:host"]
    assert moved_to != "mv-a"
    assert (await until_record(cloud, sid, "finished"))["migration_type"] == "resize"
    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    await until_record(cloud, sid, "confirmed")
    confirmed = await until_server(cloud, sid, "ACTIVE")
    assert confirmed["flavor"]["original_name"] == "m1.small"
    assert await claimed_on(cloud, sid) == [moved_to]
    assert not guest(cloud, "mv-a", sid).exists()

    cloud.openstack("server", "resize", "--flavor", "m1.medium", sid, as_json=False)
    await until_server(cloud, sid, "VERIFY_RESIZE")
    cloud.openstack("server", "resize", "revert", sid, as_json=False)
    await until_record(cloud, sid, "reverted")
    reverted = await until_server(cloud, sid, "ACTIVE")
    assert reverted["flavor"]["original_name"] == "m1.small"
    assert reverted["OS-EXT-SRV-ATTR:host"] == moved_to
    assert await claimed_on(cloud, sid) == [moved_to]
    assert guest(cloud, moved_to, sid).is_dir()
    await cloud.delete_server(sid)


async def test_a_resize_on_its_own_host_keeps_its_one_copy(cloud: Cloud, restored: None) -> None:
    """KEEL_ALLOW_RESIZE_TO_SAME_HOST: the guest is resized in place, confirmed, reverted."""
    assert cloud.processes["conductor"].stop() == 0
    cloud.start("conductor", "keel-conductor", KEEL_ALLOW_RESIZE_TO_SAME_HOST="true")
    await cloud.wait_for_service("mv-a", up=True)
    sid = str((await on(cloud, "mv-a", "mv-in-place"))["id"])
    for other in ("mv-b", "mv-c"):
        service_set(cloud, other, "--disable")
    try:
        cloud.openstack("server", "resize", "--flavor", "m1.small", sid, as_json=False)
        waiting = await until_server(cloud, sid, "VERIFY_RESIZE")
        assert waiting["OS-EXT-SRV-ATTR:host"] == "mv-a"
        metadata = json.loads((guest(cloud, "mv-a", sid) / "metadata.json").read_text())
        assert metadata["flavor"]["name"] == "m1.small"
        cloud.openstack("server", "resize", "confirm", sid, as_json=False)
        await until_record(cloud, sid, "confirmed")
        await until_server(cloud, sid, "ACTIVE")
        assert guest(cloud, "mv-a", sid).is_dir()
        assert await claimed_on(cloud, sid) == ["mv-a"]
        assert await used_mb(cloud, "mv-a") == 2048

        cloud.openstack("server", "resize", "--flavor", "m1.medium", sid, as_json=False)
        await until_server(cloud, sid, "VERIFY_RESIZE")
        cloud.openstack("server", "resize", "revert", sid, as_json=False)
        await until_record(cloud, sid, "reverted")
        reverted = await until_server(cloud, sid, "ACTIVE")
        assert reverted["flavor"]["original_name"] == "m1.small"
        metadata = json.loads((guest(cloud, "mv-a", sid) / "metadata.json").read_text())
        assert metadata["flavor"]["name"] == "m1.small"
        assert await used_mb(cloud, "mv-a") == 2048
    finally:
        for other in ("mv-b", "mv-c"):
            service_set(cloud, other, "--enable")
        cloud.processes["conductor"].stop()
        cloud.start("conductor", "keel-conductor")
    await cloud.delete_server(sid)
