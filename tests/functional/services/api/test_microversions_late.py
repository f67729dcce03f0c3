"""The microversions from 2.75 on, asked for at their version and at the one below.

The cases and the world they probe are those of
:mod:`tests.functional.services.api.test_microversions`; this module holds the later
versions, the query-string checks 2.75 brought to many routes, and the check that the
guide's microversion table (docs/microversions.md) lists as honoured exactly the versions
tested here and there.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from uuid import UUID

import pytest

from services.api.http.microversion import MAX_VERSION
from shared.context import RequestContext
from shared.db import instance_actions, instances
from tests.docs import page
from tests.functional.services.api import test_shelve_api, test_snapshot_api
from tests.functional.services.api.conftest import ADMIN, MEMBER, add_compute, place_on
from tests.functional.services.api.test_microversions import (
    CASES,
    Case,
    World,
    count,
    event_accepted,
    flavor_has,
    has,
    previous,
    status_of_get,
    world,
)

pytestmark = pytest.mark.functional

__all__ = ["world"]

ALICE = RequestContext(user_id="alice", project_id="team")


async def flavor_swap_type(w: World, v: str) -> str:
    return type((await w.get("flavors/1", v)).json()["flavor"]["swap"]).__name__


async def hypervisors_list_servers(w: World, v: str) -> bool:
    """Whether every hypervisor names its servers (``mv-1`` and ``mv-2`` have none)."""
    found = (await w.get("os-hypervisors?with_servers=true", v)).json()["hypervisors"]
    return bool(found) and all("servers" in h for h in found)


async def update_shows_all(w: World, v: str) -> bool:
    body = {"server": {"name": "renamed"}}
    answer = await w.client.put(
        f"/v2.1/servers/{w.server_id}", headers={**MEMBER, **_at(v)}, json=body
    )
    assert answer.status_code == 200, answer.text
    shown = answer.json()["server"]
    return "OS-EXT-STS:vm_state" in shown and "key_name" in shown


def _at(version: str) -> dict[str, str]:
    return {"OpenStack-API-Version": f"compute {version}"}


async def action_event(w: World, v: str, headers: dict[str, str]) -> dict[str, Any]:
    base = f"servers/{w.server_id}/os-instance-actions"
    actions = (await w.get(base, v, headers)).json()["instanceActions"]
    stop = next(a for a in actions if a["action"] == "stop")
    shown = (await w.get(f"{base}/{stop['request_id']}", v, headers)).json()
    event: dict[str, Any] = shown["instanceAction"]["events"][0]
    return event


async def event_has_details(w: World, v: str) -> bool:
    return "details" in await action_event(w, v, ADMIN)


async def extra_spec_status(w: World, v: str) -> int:
    body = {"extra_specs": {"hw:cpu_policy": "sometimes"}}
    return (await w.post("flavors/1/os-extra_specs", v, body)).status_code


async def hypervisor_detail_has(w: World, v: str, key: str) -> bool:
    found = (await w.get("os-hypervisors/detail", v)).json()["hypervisors"]
    return all(key in h for h in found)


async def keypair_generated_status(w: World, v: str) -> int:
    body = {"keypair": {"name": f"gen-{v.replace('.', '-')}"}}
    return (await w.post("os-keypairs", v, body, MEMBER)).status_code


async def evacuation_ends_stopped(w: World, v: str) -> bool:
    """Whether an evacuation asked for at ``v`` is recorded to end stopped (the evacuation
    itself is tested in test_evacuate_fenced and the conductor's test_evacuate_stopped)."""
    async with w.pool.acquire() as conn:
        placed = (await instances.get(conn, UUID(w.server_id))).host is not None
    if not placed:
        # Run the probe on a host forced down (no fence armed: evacuable at once).
        _, node = await add_compute(w.pool, "evacuated")
        await place_on(w.pool, w.server_id, node)
        async with w.pool.acquire() as conn:
            await instances.set_active(conn, UUID(w.server_id))
            await conn.execute("UPDATE services SET forced_down = true WHERE host = 'evacuated'")
    answer = await w.post(f"servers/{w.server_id}/action", v, {"evacuate": {}})
    assert answer.status_code == 200, answer.text
    async with w.pool.acquire() as conn:
        stopped: bool = await conn.fetchval(
            "SELECT end_stopped FROM migrations WHERE instance_uuid = $1 "
            "ORDER BY created_at DESC LIMIT 1",
            UUID(w.server_id),
        )
        # Ready for the next evacuation of the probe.
        await conn.execute(
            "UPDATE instances SET task_state = NULL WHERE uuid = $1", UUID(w.server_id)
        )
    return stopped


async def image_has_properties(w: World, v: str) -> bool:
    return "properties" in (await w.server(v))["image"]


async def unpin_status(w: World, v: str) -> int:
    body = {"server": {"pinned_availability_zone": None}}
    answer = await w.client.put(
        f"/v2.1/servers/{w.server_id}", headers={**MEMBER, **_at(v)}, json=body
    )
    return answer.status_code


LATE_CASES = [
    Case(
        "2.75",
        "an unknown server list filter",
        lambda w, v: status_of_get(w, v, "servers?no_such_filter=1", MEMBER),
        400,
        200,
    ),
    Case(
        "2.75",
        "a sort key Nova used to ignore",
        lambda w, v: status_of_get(w, v, "servers/detail?sort_key=vcpus", MEMBER),
        400,
        200,
    ),
    Case("2.75", "flavor swap an integer", flavor_swap_type, "int", "str"),
    Case("2.75", "hypervisor servers always", hypervisors_list_servers, True, False),
    Case("2.75", "an update shows the whole server", update_shows_all, True, False),
    Case(
        "2.78",
        "a server's topology",
        lambda w, v: status_of_get(w, v, f"servers/{w.server_id}/topology", MEMBER),
        200,
        404,
    ),
    Case(
        "2.80",
        "migrations filtered by user and project",
        lambda w, v: status_of_get(w, v, "os-migrations?user_id=alice&project_id=team"),
        200,
        400,
    ),
    Case(
        "2.83",
        "more server filters for members",
        lambda w, v: count(w, v, "servers?key_name=no-such-key", "servers", MEMBER),
        0,
        1,
    ),
    Case(
        "2.76",
        "the power-update event",
        lambda w, v: event_accepted(w, v, "power-update"),
        True,
        False,
    ),
    Case(
        "2.82",
        "the accelerator-request-bound event",
        lambda w, v: event_accepted(w, v, "accelerator-request-bound"),
        True,
        False,
    ),
    Case(
        "2.93",
        "the volume-reimaged event",
        lambda w, v: event_accepted(w, v, "volume-reimaged"),
        True,
        False,
    ),
    Case("2.84", "details in action events", event_has_details, True, False),
    Case("2.86", "extra specs checked", extra_spec_status, 400, 200),
    Case(
        "2.88",
        "hypervisors without statistics",
        lambda w, v: hypervisor_detail_has(w, v, "vcpus"),
        False,
        True,
    ),
    Case(
        "2.90",
        "hostname on create",
        lambda w, v: w.create(v, hostname="web-1"),
        202,
        400,
    ),
    Case("2.92", "key pairs are imported only", keypair_generated_status, 400, 201),
    Case("2.95", "evacuated servers end stopped", evacuation_ends_stopped, True, False),
    Case(
        "2.96",
        "the pinned zone in servers",
        lambda w, v: has(w, v, "pinned_availability_zone"),
        True,
        False,
    ),
    Case("2.98", "image properties in servers", image_has_properties, True, False),
    Case(
        "2.100",
        "scheduler hints in servers",
        lambda w, v: has(w, v, "scheduler_hints"),
        True,
        False,
    ),
    Case(
        "2.102",
        "flavors without rxtx_factor",
        lambda w, v: flavor_has(w, v, "rxtx_factor"),
        False,
        True,
    ),
    Case(
        "2.102",
        "every route refuses unknown query parameters",
        lambda w, v: status_of_get(w, v, f"servers/{w.server_id}?bogus=1", MEMBER),
        400,
        200,
    ),
    Case("2.104", "unpinning a server's zone", unpin_status, 200, 400),
    Case(
        "2.94",
        "a fully qualified hostname",
        lambda w, v: w.create(v, hostname="web-1.example.org"),
        202,
        400,
    ),
]


@pytest.mark.parametrize("case", LATE_CASES, ids=[f"{c.version} {c.what}" for c in LATE_CASES])
async def test_honoured_at_its_version_and_not_below(world: World, case: Case) -> None:
    assert await case.probe(world, case.version) == case.at
    assert await case.probe(world, previous(case.version)) == case.below


#: Routes whose query strings Nova's schemas close at 2.75: a path, with its known
#: parameters given (so the answer below 2.75 is a 200).
CLOSED_AT_2_75 = [
    "flavors?minRam=0",
    "flavors/detail?is_public=true",
    "os-keypairs?limit=5",
    "os-keypairs/k1?user_id=alice",
    "limits?tenant_id=team",
    "os-quota-sets/team",
    "os-quota-sets/team/detail",
    "os-server-groups?all_projects=false",
    "os-services?binary=nova-compute",
    "os-simple-tenant-usage?detailed=1&start=2000-01-01T00:00:00",
    "os-simple-tenant-usage/team?start=2000-01-01T00:00:00",
    "servers?name=probed",
    "servers/detail?all_tenants=1",
]


@pytest.mark.parametrize("path", CLOSED_AT_2_75)
async def test_an_unknown_query_parameter_is_refused_from_2_75(world: World, path: str) -> None:
    headers = MEMBER if path.startswith("os-keypairs") else ADMIN
    unknown = f"{path}&bogus=1" if "?" in path else f"{path}?bogus=1"
    assert (await world.get(path, "2.75", headers)).status_code == 200
    assert (await world.get(unknown, "2.74", headers)).status_code == 200
    refused = await world.get(unknown, "2.75", headers)
    assert refused.status_code == 400, refused.text
    assert (
        world.message(refused) == "Additional properties are not allowed ('bogus' was unexpected)"
    )


async def test_the_keypair_and_quota_routes_that_change_are_closed_too(world: World) -> None:
    deleted = await world.client.delete(
        "/v2.1/os-keypairs/k2?bogus=1", headers={**MEMBER, **_at("2.75")}
    )
    assert deleted.status_code == 400
    assert (await world.get("os-keypairs/k2", "2.75", MEMBER)).status_code == 200
    reverted = await world.client.delete(
        "/v2.1/os-quota-sets/team?bogus=1", headers={**ADMIN, **_at("2.75")}
    )
    assert reverted.status_code == 400
    updated = await world.client.put(
        "/v2.1/os-quota-sets/team?bogus=1",
        headers={**ADMIN, **_at("2.75")},
        json={"quota_set": {"instances": 11}},
    )
    assert updated.status_code == 400
    assert (await world.get("os-quota-sets/team", "2.75")).json()["quota_set"]["instances"] != 11


async def test_instance_actions_and_migrations_refuse_unknown_names_from_their_paging(
    world: World,
) -> None:
    actions = f"servers/{world.server_id}/os-instance-actions?bogus=1"
    assert await status_of_get(world, "2.57", actions, MEMBER) == 200
    assert await status_of_get(world, "2.58", actions, MEMBER) == 400
    assert await status_of_get(world, "2.58", "os-migrations?bogus=1") == 200
    assert await status_of_get(world, "2.59", "os-migrations?bogus=1") == 400
    assert await status_of_get(world, "2.66", "os-migrations?changes-before=2000-01-01") == 200
    assert await status_of_get(world, "2.65", "os-migrations?changes-before=2000-01-01") == 400


async def test_hypervisors_refuse_unknown_names_from_2_53(world: World) -> None:
    assert await status_of_get(world, "2.52", "os-hypervisors?bogus=1") == 200
    assert await status_of_get(world, "2.53", "os-hypervisors/detail?bogus=1") == 400
    node = (await world.get("os-hypervisors", "2.53")).json()["hypervisors"][0]["id"]
    assert await status_of_get(world, "2.53", f"os-hypervisors/{node}?with_servers=1") == 200
    assert await status_of_get(world, "2.53", f"os-hypervisors/{node}?bogus=1") == 400


async def test_members_filter_by_vm_state_from_2_83(world: World) -> None:
    assert await count(world, "2.83", "servers?vm_state=stopped", "servers", MEMBER) == 0
    assert await count(world, "2.83", "servers?vm_state=building", "servers", MEMBER) == 1
    assert await count(world, "2.82", "servers?vm_state=stopped", "servers", MEMBER) == 1


async def test_a_topology_is_empty_and_only_for_the_servers_owner(world: World) -> None:
    path = f"servers/{world.server_id}/topology"
    shown = await world.get(path, "2.78", MEMBER)
    assert shown.json() == {"nodes": [], "pagesize_kb": None}
    twice = await asyncio.gather(world.get(path, "2.78", MEMBER), world.get(path, "2.78", MEMBER))
    assert [answer.json() for answer in twice] == [shown.json()] * 2
    other = await world.get(path, "2.78", {"X-Auth-Token": "other-token"})
    assert other.status_code == 404
    assert (await world.get("servers/no-such-server/topology", "2.78")).status_code == 404


async def test_failed_event_details_say_why_and_members_never_see_them(world: World) -> None:
    base = f"servers/{world.server_id}/os-instance-actions"
    event = await action_event(world, "2.84", ADMIN)
    assert event["details"] is None
    assert "details" not in await action_event(world, "2.84", MEMBER)
    async with world.pool.acquire() as conn:
        await instance_actions.start(conn, ALICE, UUID(world.server_id), "reboot")
        await instance_actions.finish(conn, UUID(world.server_id), "reboot", "host on fire")
    actions = (await world.get(base, "2.84")).json()["instanceActions"]
    reboot = next(a for a in actions if a["action"] == "reboot")
    shown = (await world.get(f"{base}/{reboot['request_id']}", "2.84")).json()["instanceAction"]
    assert shown["events"][0]["details"] == "host on fire"
    listed = (await world.get(base, "2.84")).json()["instanceActions"]
    assert all("details" not in action for action in listed)


async def test_known_extra_specs_are_kept_and_unknown_namespaces_unchecked(world: World) -> None:
    good = {"hw:cpu_policy": "dedicated", "hw:numa_nodes": 1, "keel:rack": "r1"}
    made = await world.post("flavors/1/os-extra_specs", "2.86", {"extra_specs": good})
    assert made.status_code == 200, made.text
    assert made.json()["extra_specs"]["hw:numa_nodes"] == "1"
    typo = await world.client.put(
        "/v2.1/flavors/1/os-extra_specs/hw:cpu_polcy",
        headers={**ADMIN, **_at("2.86")},
        json={"hw:cpu_polcy": "dedicated"},
    )
    assert typo.status_code == 400
    assert "'hw:cpu_polcy' does not appear to be a valid extra spec" in world.message(typo)
    listed = (await world.get("flavors/1/os-extra_specs", "2.86")).json()["extra_specs"]
    assert "hw:cpu_polcy" not in listed
    assert listed["keel:rack"] == "r1"


async def test_hypervisor_statistics_and_uptime_routes_are_gone_from_2_88(world: World) -> None:
    node = (await world.get("os-hypervisors", "2.87")).json()["hypervisors"][0]["id"]
    assert await status_of_get(world, "2.87", "os-hypervisors/statistics") == 200
    assert await status_of_get(world, "2.88", "os-hypervisors/statistics") == 404
    assert await status_of_get(world, "2.88", f"os-hypervisors/{node}/uptime") == 404
    shown = (await world.get(f"os-hypervisors/{node}?with_servers=true", "2.88")).json()
    hypervisor = shown["hypervisor"]
    # The stand-in hosts have no agent to ask: their uptime is unknown, not an error.
    assert hypervisor["uptime"] is None
    assert hypervisor["servers"] == []
    assert "cpu_info" not in hypervisor
    assert "service" in hypervisor
    older = (await world.get(f"os-hypervisors/{node}", "2.87")).json()["hypervisor"]
    assert "uptime" not in older
    assert "servers" not in older
    assert older["cpu_info"] == {}


def guide_table() -> dict[str, str]:
    """The guide's microversion table (docs/microversions.md): version → its status column."""
    rows: dict[str, str] = {}
    for line in page("microversions.md").splitlines():
        match = re.match(r"^\| (2\.\d+) \| ([^|]+) \|", line)
        if match:
            rows[match[1]] = match[2].strip()
    return rows


#: Honoured versions whose probe needs more than the probes' world (an agent that takes
#: the request): version → the module and test that check it at that version and below.
TESTED_ELSEWHERE = {
    "2.45": (test_snapshot_api, "test_from_2_45_the_answer_is_the_image_id"),
    "2.77": (test_shelve_api, "test_unshelve_into_a_zone_or_onto_a_host"),
    "2.91": (test_shelve_api, "test_unshelve_into_a_zone_or_onto_a_host"),
}


def test_the_guide_lists_every_microversion_and_what_is_tested_as_honoured() -> None:
    rows = guide_table()
    every = [f"2.{minor}" for minor in range(1, MAX_VERSION.minor + 1)]
    assert list(rows) == every
    assert set(rows.values()) <= {"honoured", "not applicable"}
    honoured = {version for version, status in rows.items() if status == "honoured"}
    for module, name in TESTED_ELSEWHERE.values():
        assert callable(getattr(module, name, None)), f"{module.__name__} has no {name}"
    tested = {case.version for case in [*CASES, *LATE_CASES]} | {"2.1"} | set(TESTED_ELSEWHERE)
    assert honoured == tested
