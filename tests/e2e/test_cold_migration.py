"""Cold migration with real agents and the real CLI: migrate, then confirm or revert.

Three hosts with the local driver (guests are directories holding a ``power`` file).
At every step the claims must add up (usage equal to the sum of allocations on every
node) and, once confirmed or reverted, exactly one copy of the guest exists.
"""

from __future__ import annotations

import pytest

from tests.e2e.cloud import CIRROS_ID, Cloud, CloudConfig
from tests.e2e.moves import (
    SETTLE,
    claimed_on,
    guest,
    latest_record,
    migrate,
    on,
    shown,
    until_record,
    until_server,
)
from tests.e2e.test_crash_recovery import killed, replace, up
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTS = ("cm-a", "cm-b", "cm-c")


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=HOSTS, env=(("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"),))


def power(cloud: Cloud, host: str, server_id: str) -> str:
    found = guest(cloud, host, server_id) / "power"
    return found.read_text().strip() if found.exists() else "running"


def copies(cloud: Cloud, server_id: str) -> list[str]:
    return [host for host in HOSTS if guest(cloud, host, server_id).is_dir()]


async def test_migrate_then_confirm_leaves_one_copy_on_the_destination(cloud: Cloud) -> None:
    server = await on(cloud, "cm-a", "cm-confirm")
    sid = server["id"]

    migrate(cloud, sid)
    verify = await until_server(cloud, sid, "VERIFY_RESIZE")
    dest = verify["OS-EXT-SRV-ATTR:host"]
    assert dest in ("cm-b", "cm-c")
    finished = await latest_record(cloud, sid)
    assert (finished["migration_type"], finished["status"]) == ("migration", "finished")
    assert (finished["source_compute"], finished["dest_compute"]) == ("cm-a", dest)
    # Until confirmed: the source keeps its (shut down) copy and its claim.
    assert copies(cloud, sid) == sorted(["cm-a", dest])
    assert power(cloud, "cm-a", sid) == "shutdown"
    assert power(cloud, dest, sid) == "running"
    assert await claimed_on(cloud, sid) == sorted(["cm-a", dest])

    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    active = await until_server(cloud, sid, "ACTIVE")
    assert active["OS-EXT-SRV-ATTR:host"] == dest
    assert (await until_record(cloud, sid, "confirmed"))["dest_compute"] == dest
    assert copies(cloud, sid) == [dest]
    assert await claimed_on(cloud, sid) == [dest]

    listed = cloud.openstack("server", "migration", "list", "--server", sid)
    assert [(m["Type"], m["Status"]) for m in listed] == [("migration", "confirmed")]
    events = cloud.openstack("server", "event", "list", sid)
    assert {e["Action"] for e in events} >= {"create", "migrate", "confirmResize"}
    await cloud.delete_server(sid)


async def test_migrate_to_a_host_then_revert_returns_to_the_source(cloud: Cloud) -> None:
    server = await on(cloud, "cm-a", "cm-revert")
    sid = server["id"]

    migrate(cloud, sid, "cm-c")
    verify = await until_server(cloud, sid, "VERIFY_RESIZE")
    assert verify["OS-EXT-SRV-ATTR:host"] == "cm-c"
    assert copies(cloud, sid) == ["cm-a", "cm-c"]
    assert await claimed_on(cloud, sid) == ["cm-a", "cm-c"]

    cloud.openstack("server", "resize", "revert", sid, as_json=False)
    active = await until_server(cloud, sid, "ACTIVE")
    assert active["OS-EXT-SRV-ATTR:host"] == "cm-a"
    await until_record(cloud, sid, "reverted")
    assert copies(cloud, sid) == ["cm-a"]
    assert power(cloud, "cm-a", sid) == "running"
    assert await claimed_on(cloud, sid) == ["cm-a"]
    events = cloud.openstack("server", "event", "list", sid)
    assert {e["Action"] for e in events} >= {"migrate", "revertResize"}
    await cloud.delete_server(sid)


async def test_a_stopped_server_stays_stopped_through_migration(cloud: Cloud) -> None:
    server = await on(cloud, "cm-b", "cm-stopped")
    sid = server["id"]
    cloud.openstack("server", "stop", sid, as_json=False)
    await until_server(cloud, sid, "SHUTOFF")

    migrate(cloud, sid, "cm-a")
    await until_server(cloud, sid, "VERIFY_RESIZE")
    assert power(cloud, "cm-a", sid) == "shutdown"
    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    stopped = await until_server(cloud, sid, "SHUTOFF")
    assert stopped["OS-EXT-SRV-ATTR:host"] == "cm-a"
    assert copies(cloud, sid) == ["cm-a"]
    assert await claimed_on(cloud, sid) == ["cm-a"]
    await cloud.delete_server(sid)


async def test_bad_migrations_are_refused_and_change_nothing(cloud: Cloud) -> None:
    server = await on(cloud, "cm-a", "cm-refused")
    sid = server["id"]
    headers = {"OpenStack-API-Version": "compute 2.56"}

    async with cloud.http(cloud.member_token) as http:
        body = {"name": "cm-mine", "flavorRef": "1", "imageRef": str(CIRROS_ID)}
        created = await http.post("servers", json={"server": body})
        assert created.status_code == 202, created.text
        mine = created.json()["server"]["id"]
        await until_server(cloud, mine, "ACTIVE")
        member = await http.post(f"servers/{mine}/action", json={"migrate": None})
    assert member.status_code == 403, member.text
    await cloud.delete_server(mine)
    async with cloud.http(cloud.admin_token) as http:
        unknown = await http.post(
            f"servers/{sid}/action", json={"migrate": {"host": "nowhere"}}, headers=headers
        )
        same = await http.post(
            f"servers/{sid}/action", json={"migrate": {"host": "cm-a"}}, headers=headers
        )
        confirm = await http.post(f"servers/{sid}/action", json={"confirmResize": None})
        revert = await http.post(f"servers/{sid}/action", json={"revertResize": None})
    assert unknown.status_code == 400
    assert "Compute host nowhere could not be found." in unknown.text
    assert same.status_code == 400
    assert confirm.status_code == 409
    assert revert.status_code == 409
    found = await cloud.get(f"os-migrations?instance_uuid={sid}", version="2.59")
    assert found["migrations"] == []
    assert (await shown(cloud, sid))["status"] == "ACTIVE"
    assert await claimed_on(cloud, sid) == ["cm-a"]
    await cloud.delete_server(sid)


async def test_deleting_a_server_awaiting_confirmation_removes_both_copies(cloud: Cloud) -> None:
    server = await on(cloud, "cm-b", "cm-deleted")
    sid = server["id"]
    migrate(cloud, sid, "cm-c")
    await until_server(cloud, sid, "VERIFY_RESIZE")

    await cloud.delete_server(sid)

    async def gone() -> bool:
        return copies(cloud, sid) == []

    await wait_until(gone, what=f"both copies of {sid} removed", timeout=SETTLE)
    assert await claimed_on(cloud, sid) == []
    assert (await latest_record(cloud, sid))["status"] == "confirmed"


async def test_conductor_killed_after_choosing_the_destination_another_finishes_it(
    cloud: Cloud,
) -> None:
    """The destination is claimed and recorded, the rebuild never sent: redelivery sends it."""
    doomed = replace(
        cloud,
        "conductor",
        "keel-conductor",
        "controller",
        KEEL_FAULT_INJECT="conductor.move.after_destination",
    )
    await up(cloud, "keel-conductor", "controller")
    # The agents' heartbeats went unanswered while the conductor was replaced.
    for host in ("cm-a", "cm-b"):
        await up(cloud, "keel-compute", host)
    sid = (await on(cloud, "cm-a", "cm-crash-move"))["id"]

    migrate(cloud, sid, "cm-b")
    await killed(doomed)
    assert (await latest_record(cloud, sid))["status"] == "pre-migrating"
    cloud.start("conductor", "keel-conductor", "controller")

    verify = await until_server(cloud, sid, "VERIFY_RESIZE")
    assert verify["OS-EXT-SRV-ATTR:host"] == "cm-b"
    assert (await latest_record(cloud, sid))["status"] == "finished"
    assert copies(cloud, sid) == ["cm-a", "cm-b"]
    assert await claimed_on(cloud, sid) == ["cm-a", "cm-b"]
    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    await until_record(cloud, sid, "confirmed")
    assert copies(cloud, sid) == ["cm-b"]
    assert await claimed_on(cloud, sid) == ["cm-b"]
    await cloud.delete_server(sid)


async def test_destination_agent_killed_after_building_the_copy_reports_it_on_return(
    cloud: Cloud,
) -> None:
    """The copy exists, the conductor was never told: the agent's redelivered rebuild is."""
    doomed = replace(
        cloud, "cm-c", "keel-compute", "cm-c", KEEL_FAULT_INJECT="compute.rebuild.after_spawn"
    )
    await up(cloud, "keel-compute", "cm-c")
    sid = (await on(cloud, "cm-a", "cm-crash-rebuild"))["id"]

    migrate(cloud, sid, "cm-c")
    await killed(doomed)
    assert guest(cloud, "cm-c", sid).is_dir()
    cloud.start("cm-c", "keel-compute", "cm-c")

    verify = await until_server(cloud, sid, "VERIFY_RESIZE")
    assert verify["OS-EXT-SRV-ATTR:host"] == "cm-c"
    assert copies(cloud, sid) == ["cm-a", "cm-c"]
    cloud.openstack("server", "resize", "revert", sid, as_json=False)
    active = await until_server(cloud, sid, "ACTIVE")
    assert active["OS-EXT-SRV-ATTR:host"] == "cm-a"
    await until_record(cloud, sid, "reverted")
    assert copies(cloud, sid) == ["cm-a"]
    assert await claimed_on(cloud, sid) == ["cm-a"]
    await cloud.delete_server(sid)


async def test_conductor_killed_after_the_source_copy_went_confirms_on_redelivery(
    cloud: Cloud,
) -> None:
    """The old copy is gone but the record still says confirming: the next conductor ends it."""
    doomed = replace(
        cloud,
        "conductor",
        "keel-conductor",
        "controller",
        KEEL_FAULT_INJECT="conductor.confirm.after_remove",
    )
    await up(cloud, "keel-conductor", "controller")
    # The agents' heartbeats went unanswered while the conductor was replaced.
    for host in ("cm-a", "cm-b"):
        await up(cloud, "keel-compute", host)
    sid = (await on(cloud, "cm-a", "cm-crash-confirm"))["id"]
    migrate(cloud, sid, "cm-b")
    await until_server(cloud, sid, "VERIFY_RESIZE")

    cloud.openstack("server", "resize", "confirm", sid, as_json=False)
    await killed(doomed)
    assert copies(cloud, sid) == ["cm-b"]
    assert (await latest_record(cloud, sid))["status"] == "confirming"
    # The next conductor ends it: on the confirm delivered again if cm-a's agent is up
    # by then, else (its heartbeats went unanswered while no conductor ran) by the stall
    # sweep once it is, after twice the call timeout.
    cloud.start("conductor", "keel-conductor", "controller", KEEL_RPC__CALL_TIMEOUT="5")

    await until_record(cloud, sid, "confirmed")
    active = await until_server(cloud, sid, "ACTIVE")
    assert active["OS-EXT-SRV-ATTR:host"] == "cm-b"
    assert copies(cloud, sid) == ["cm-b"]
    assert await claimed_on(cloud, sid) == ["cm-b"]
    await cloud.delete_server(sid)
