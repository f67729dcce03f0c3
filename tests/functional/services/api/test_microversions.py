"""Every microversion keel honours, asked for at that version and at the one below.

Each case names a microversion, a probe (a request and what to observe in its answer)
and what is observed at that version and just below it. The guide's microversion table
(docs/microversions.md) lists the same versions as honoured; test_microversions_late,
which holds the versions from 2.75 on, checks the two agree.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.http.microversion import APIVersion
from services.api.servers.diagnostics import diagnostics_view
from services.compute.rpcapi import GuestDiagnostics
from shared.config import Settings
from shared.context import RequestContext
from shared.db import instance_actions, instances
from tests.functional.services.api.conftest import (
    ADMIN,
    IMAGE_ID,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional


@dataclass
class World:
    client: httpx.AsyncClient
    pool: asyncpg.Pool
    server_id: str
    deleted_id: str
    network_id: str

    async def get(self, path: str, version: str, headers: dict[str, str] = ADMIN) -> httpx.Response:
        return await self.client.get(f"/v2.1/{path}", headers=at(version, headers))

    async def post(
        self, path: str, version: str, body: Any, headers: dict[str, str] = ADMIN
    ) -> httpx.Response:
        return await self.client.post(f"/v2.1/{path}", headers=at(version, headers), json=body)

    async def server(self, version: str, headers: dict[str, str] = ADMIN) -> dict[str, Any]:
        response = await self.get(f"servers/{self.server_id}", version, headers)
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()["server"]
        return found

    async def create(self, version: str, **fields: Any) -> int:
        body = server_body(f"probe-{uuid.uuid4().hex[:8]}", **fields)
        return (await self.post("servers", version, body)).status_code

    def message(self, response: httpx.Response) -> str:
        body = response.json()
        return str(next(iter(body.values())).get("message", "")) if body else ""


Probe = Callable[[World, str], Awaitable[Any]]


@pytest.fixture
async def world(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder, settings: Settings
) -> World:
    await add_image(db_pool)
    for host in ("mv-1", "mv-2"):
        await add_compute(db_pool, host)
    body = server_body("probed", description="d", tags=["t"])
    created = await client.post("/v2.1/servers", headers=at("2.74", MEMBER), json=body)
    assert created.status_code == 202, created.text
    server_id = created.json()["server"]["id"]
    gone = await client.post("/v2.1/servers", headers=at("2.74", MEMBER), json=server_body("gone"))
    deleted_id = gone.json()["server"]["id"]
    async with db_pool.acquire() as conn:
        await instances.soft_delete(conn, UUID(deleted_id))
        await instance_actions.start(
            conn, RequestContext(user_id="alice", project_id="team"), UUID(server_id), "stop"
        )
        await instance_actions.finish(conn, UUID(server_id), "stop", None)
        # Both servers ran for an hour, so usage has two entries to page through.
        await conn.execute("UPDATE instances SET launched_at = now() - interval '1 hour'")
    for name in ("k1", "k2"):
        made = await client.post(
            "/v2.1/os-keypairs", headers=at("2.74", MEMBER), json={"keypair": {"name": name}}
        )
        assert made.status_code == 201, made.text
    return World(client, db_pool, server_id, deleted_id, str(settings.network.network_id))


async def keypair_status(w: World, v: str) -> int:
    body = {"keypair": {"name": f"k-{uuid.uuid4().hex[:6]}"}}
    return (await w.post("os-keypairs", v, body, MEMBER)).status_code


async def keypair_for_user(w: World, v: str) -> int:
    body = {"keypair": {"name": f"k-{uuid.uuid4().hex[:6]}", "user_id": "alice"}}
    return (await w.post("os-keypairs", v, body)).status_code


async def rebuild_with_key_status(w: World, v: str) -> int:
    """A rebuild naming a key pair: read from 2.54 (then refused only for the server's
    state), an unknown field below (400)."""
    body = {"rebuild": {"imageRef": str(IMAGE_ID), "key_name": "k1"}}
    return (await w.post(f"servers/{w.server_id}/action", v, body, MEMBER)).status_code


async def has(w: World, v: str, key: str, headers: dict[str, str] = ADMIN) -> bool:
    return key in await w.server(v, headers)


async def ip6_member_count(w: World, v: str) -> int:
    found = await w.get("servers?ip6=fd00:ffff::1", v, MEMBER)
    return len(found.json()["servers"])


async def services_forced_down(w: World, v: str) -> bool:
    listed = (await w.get("os-services", v)).json()["services"]
    return all("forced_down" in s for s in listed)


async def evacuate_says(w: World, v: str, body: dict[str, Any]) -> bool:
    """Whether the body's fields are refused as additional properties."""
    answer = await w.post(f"servers/{w.server_id}/action", v, {"evacuate": body})
    return "additional properties" in w.message(answer)


async def live_status(w: World, v: str, body: dict[str, Any]) -> int:
    """``os-migrateLive`` of the building server: 409 once the body parses, else 400."""
    answer = await w.post(f"servers/{w.server_id}/action", v, {"os-migrateLive": body})
    return answer.status_code


async def force_complete_status(w: World, v: str) -> int:
    """A bad force_complete body: 400 where the route exists, 404 below it."""
    answer = await w.post(f"servers/{w.server_id}/migrations/1/action", v, {"other": None})
    return answer.status_code


async def abort_status(w: World, v: str, migration: str = "x") -> int:
    path = f"/v2.1/servers/{w.server_id}/migrations/{migration}"
    return (await w.client.delete(path, headers=at(v))).status_code


async def abort_accepted_status(w: World, v: str) -> int:
    """Abort a live migration still ``accepted``: from 2.65 only."""
    async with w.pool.acquire() as conn:
        number = await conn.fetchval(
            """INSERT INTO migrations (uuid, instance_uuid, migration_type, status,
                                       created_at, updated_at)
               VALUES ($1, $2, 'live-migration', 'accepted', now(), now()) RETURNING id""",
            uuid.uuid4(),
            UUID(w.server_id),
        )
    return await abort_status(w, v, str(number))


LIVE_2_25 = {"host": None, "block_migration": "auto"}


async def status_of_get(w: World, v: str, path: str, headers: dict[str, str] = ADMIN) -> int:
    return (await w.get(path, v, headers)).status_code


async def cpu_info_type(w: World, v: str) -> str:
    found = (await w.get("os-hypervisors/detail", v)).json()["hypervisors"]
    return type(found[0]["cpu_info"]).__name__


async def network_tag_status(w: World, v: str) -> int:
    return await w.create(v, networks=[{"uuid": w.network_id, "tag": "nic1"}])


async def count(w: World, v: str, path: str, key: str, headers: dict[str, str] = ADMIN) -> int:
    return len((await w.get(path, v, headers)).json()[key])


async def limits_has(w: World, v: str, key: str) -> bool:
    return key in (await w.get("limits", v, MEMBER)).json()["limits"]["absolute"]


async def quota_has(w: World, v: str, key: str) -> bool:
    return key in (await w.get("os-quota-sets/team", v)).json()["quota_set"]


async def quota_class_has(w: World, v: str, key: str) -> bool:
    return key in (await w.get("os-quota-class-sets/default", v)).json()["quota_class_set"]


async def event_accepted(w: World, v: str, name: str) -> bool:
    """Whether an external event of that name is taken at all (not a 400) at ``v``."""
    event = {"name": name, "server_uuid": w.server_id, "tag": "t"}
    answer = await w.post("os-server-external-events", v, {"events": [event]})
    return answer.status_code != 400


async def request_id_header(w: World, v: str) -> bool:
    return "x-openstack-request-id" in (await w.get("flavors", v)).headers


async def flavor_is_embedded(w: World, v: str) -> bool:
    return "original_name" in (await w.server(v))["flavor"]


async def member_sees_events(w: World, v: str) -> bool:
    base = f"servers/{w.server_id}/os-instance-actions"
    actions = (await w.get(base, v, MEMBER)).json()["instanceActions"]
    shown = await w.get(f"{base}/{actions[0]['request_id']}", v, MEMBER)
    return "events" in shown.json()["instanceAction"]


async def event_has_host(w: World, v: str) -> bool:
    base = f"servers/{w.server_id}/os-instance-actions"
    actions = (await w.get(base, v)).json()["instanceActions"]
    stop = next(a for a in actions if a["action"] == "stop")
    [event] = (await w.get(f"{base}/{stop['request_id']}", v)).json()["instanceAction"]["events"]
    return "host" in event and "hostId" in event


async def service_id_type(w: World, v: str) -> str:
    return type((await w.get("os-services", v)).json()["services"][0]["id"]).__name__


async def flavor_has(w: World, v: str, key: str) -> bool:
    return key in (await w.get("flavors/1", v)).json()["flavor"]


async def migrate_host_named(w: World, v: str) -> bool:
    """Whether the host in the body is read (below 2.56 Nova ignores the body)."""
    answer = await w.post(f"servers/{w.server_id}/action", v, {"migrate": {"host": "no/where"}})
    return "not a host name" in (w.message(answer) if answer.content else "")


async def personality_status(w: World, v: str) -> int:
    return await w.create(v, personality=[])


async def actions_paged(w: World, v: str) -> int:
    path = f"servers/{w.server_id}/os-instance-actions?limit=1"
    return await count(w, v, path, "instanceActions", MEMBER)


async def migrations_paged(w: World, v: str) -> int:
    answer = await w.get("os-migrations?limit=notanumber", v)
    return answer.status_code


async def trusted_certs_status(w: World, v: str) -> int:
    return await w.create(v, trusted_image_certificates=None)


async def changes_before_count(w: World, v: str) -> int:
    return await count(w, v, "servers?changes-before=2000-01-01T00:00:00Z", "servers", MEMBER)


async def locked_filter_count(w: World, v: str) -> int:
    return await count(w, v, "servers?locked=true", "servers", MEMBER)


async def public_flavor_access_status(w: World, v: str) -> int:
    added = await w.post("flavors/1/action", v, {"addTenantAccess": {"tenant": f"p-{v}"}})
    return added.status_code


async def diagnostics_standard(w: World, v: str) -> bool:
    """The view of an agent's answer at ``v`` (the agent itself is not in this world)."""
    found = GuestDiagnostics(state="running", driver="libvirt")
    return "num_cpus" in diagnostics_view(found, APIVersion.parse(v))


async def group_status(w: World, v: str, group: dict[str, Any]) -> int:
    made = await w.post("os-server-groups", v, {"server_group": {"name": "g", **group}})
    return made.status_code


async def group_has_project(w: World, v: str) -> bool:
    made = await w.post(
        "os-server-groups", v, {"server_group": {"name": "g", "policies": ["affinity"]}}
    )
    return "project_id" in made.json()["server_group"]


async def aggregate_has_uuid(w: World, v: str) -> bool:
    made = await w.post("os-aggregates", v, {"aggregate": {"name": f"a-{v}"}})
    return "uuid" in made.json()["aggregate"]


async def destination_status(w: World, v: str) -> int:
    return await w.create(v, host="mv-2")


async def tags_on_create(w: World, v: str) -> int:
    return await w.create(v, tags=["a"])


async def description_on_create(w: World, v: str) -> int:
    return await w.create(v, description="x")


async def none_networks(w: World, v: str) -> int:
    return await w.create(v, networks="none")


async def usage_paged(w: World, v: str) -> bool:
    period = "start=2000-01-01T00:00:00&end=2100-01-01T00:00:00"
    answer = await w.get(f"os-simple-tenant-usage/team?{period}&limit=1", v)
    return "tenant_usage_links" in answer.json()


@dataclass(frozen=True)
class Case:
    version: str
    what: str
    probe: Probe
    at: Any
    below: Any


CASES = [
    Case("2.2", "keypair create answers 201", keypair_status, 201, 200),
    Case(
        "2.3",
        "extended server attributes",
        lambda w, v: has(w, v, "OS-EXT-SRV-ATTR:hostname"),
        True,
        False,
    ),
    Case("2.5", "ip6 filter for members", ip6_member_count, 0, 1),
    Case("2.7", "no access list for a public flavor", public_flavor_access_status, 409, 200),
    Case("2.9", "locked in server", lambda w, v: has(w, v, "locked"), True, False),
    Case("2.10", "admin keypair for a user", keypair_for_user, 201, 400),
    Case("2.11", "forced_down in os-services", services_forced_down, True, False),
    Case(
        "2.14",
        "evacuate without onSharedStorage",
        lambda w, v: evacuate_says(w, v, {"onSharedStorage": False}),
        True,
        False,
    ),
    Case("2.13", "project_id in server groups", group_has_project, True, False),
    Case(
        "2.15",
        "soft server group policies",
        lambda w, v: group_status(w, v, {"policies": ["soft-affinity"]}),
        200,
        400,
    ),
    Case("2.16", "host_status for admins", lambda w, v: has(w, v, "host_status"), True, False),
    Case("2.19", "server description", description_on_create, 202, 400),
    Case(
        "2.21",
        "actions of deleted servers",
        lambda w, v: status_of_get(w, v, f"servers/{w.deleted_id}/os-instance-actions", MEMBER),
        200,
        404,
    ),
    Case("2.22", "force_complete of a live migration", force_complete_status, 400, 404),
    Case("2.24", "abort of a live migration", abort_status, 400, 404),
    Case("2.25", "block_migration auto", lambda w, v: live_status(w, v, LIVE_2_25), 409, 400),
    Case(
        "2.30",
        "live migration force",
        lambda w, v: live_status(w, v, {**LIVE_2_25, "force": False}),
        409,
        400,
    ),
    Case(
        "2.34",
        "live migration checks after the 202 (at every version in keel)",
        lambda w, v: live_status(w, v, LIVE_2_25),
        409,
        409,
    ),
    Case("2.65", "abort of an accepted live migration", abort_accepted_status, 202, 400),
    Case(
        "2.68",
        "live migration force gone",
        lambda w, v: live_status(w, v, {**LIVE_2_25, "force": False}),
        400,
        409,
    ),
    Case(
        "2.23",
        "a server's migrations",
        lambda w, v: status_of_get(w, v, f"servers/{w.server_id}/migrations"),
        200,
        404,
    ),
    Case(
        "2.26",
        "server tags",
        lambda w, v: status_of_get(w, v, f"servers/{w.server_id}/tags", MEMBER),
        200,
        404,
    ),
    Case("2.27", "the OpenStack-API-Version header", request_id_header, True, True),
    Case("2.28", "cpu_info as an object", cpu_info_type, "dict", "str"),
    Case("2.29", "evacuate force", lambda w, v: evacuate_says(w, v, {"force": False}), False, True),
    Case("2.32", "network tags", network_tag_status, 202, 400),
    Case(
        "2.33",
        "hypervisor paging",
        lambda w, v: count(w, v, "os-hypervisors?limit=1", "hypervisors"),
        1,
        2,
    ),
    Case(
        "2.35",
        "keypair paging",
        lambda w, v: count(w, v, "os-keypairs?limit=1", "keypairs", MEMBER),
        1,
        2,
    ),
    Case(
        "2.36",
        "network limits and the image proxy gone",
        lambda w, v: limits_has(w, v, "maxSecurityGroups"),
        False,
        True,
    ),
    Case("2.37", "networks auto and none", none_networks, 202, 202),
    Case(
        "2.38",
        "an invalid status filter",
        lambda w, v: status_of_get(w, v, "servers?status=NOPE", MEMBER),
        400,
        200,
    ),
    Case("2.39", "maxImageMeta gone", lambda w, v: limits_has(w, v, "maxImageMeta"), False, True),
    Case("2.40", "usage paging", usage_paged, True, False),
    Case("2.41", "the uuid of aggregates", aggregate_has_uuid, True, False),
    Case("2.42", "network tags again", network_tag_status, 202, 400),
    Case("2.46", "X-OpenStack-Request-ID", request_id_header, True, True),
    Case("2.47", "the flavor embedded in servers", flavor_is_embedded, True, False),
    Case("2.48", "standard server diagnostics", diagnostics_standard, True, False),
    Case(
        "2.50",
        "server groups in quota classes",
        lambda w, v: quota_class_has(w, v, "server_groups"),
        True,
        False,
    ),
    Case(
        "2.51",
        "the volume-extended event",
        lambda w, v: event_accepted(w, v, "volume-extended"),
        True,
        False,
    ),
    Case("2.51", "action events for members", member_sees_events, True, False),
    Case("2.52", "tags on create", tags_on_create, 202, 400),
    Case("2.53", "service ids are UUIDs", service_id_type, "str", "int"),
    Case("2.54", "rebuild takes key_name", rebuild_with_key_status, 409, 400),
    Case("2.55", "flavor description", lambda w, v: flavor_has(w, v, "description"), True, False),
    Case("2.56", "migrate to a host", migrate_host_named, True, False),
    Case("2.57", "personality gone", personality_status, 400, 202),
    Case("2.58", "instance action paging", actions_paged, 1, 2),
    Case("2.59", "migration paging", migrations_paged, 400, 200),
    Case("2.61", "flavor extra_specs", lambda w, v: flavor_has(w, v, "extra_specs"), True, False),
    Case("2.62", "host and hostId in action events", event_has_host, True, False),
    Case("2.63", "trusted_image_certificates", trusted_certs_status, 202, 400),
    Case("2.66", "changes-before", changes_before_count, 0, 1),
    Case(
        "2.68",
        "evacuate force gone",
        lambda w, v: evacuate_says(w, v, {"force": False}),
        True,
        False,
    ),
    Case(
        "2.64",
        "a server group's policy and rules",
        lambda w, v: group_status(w, v, {"policy": "anti-affinity", "rules": {}}),
        200,
        400,
    ),
    Case("2.71", "server_groups in show", lambda w, v: has(w, v, "server_groups"), True, False),
    Case("2.73", "the locked filter", locked_filter_count, 0, 1),
    Case("2.74", "a requested destination", destination_status, 202, 400),
]


def previous(version: str) -> str:
    major, minor = version.split(".")
    return f"{major}.{int(minor) - 1}"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.version} {c.what}" for c in CASES])
async def test_honoured_at_its_version_and_not_below(world: World, case: Case) -> None:
    assert await case.probe(world, case.version) == case.at
    assert await case.probe(world, previous(case.version)) == case.below


async def test_the_image_proxy_is_gone_from_2_36(world: World) -> None:
    assert (await world.get("images", "2.35")).status_code == 200
    gone = await world.get("images", "2.36")
    assert gone.status_code == 404
    assert "/image/v2/images" in world.message(gone)


async def test_network_quotas_show_below_2_36_and_setting_them_changes_nothing(
    world: World,
) -> None:
    assert await quota_has(world, "2.35", "floating_ips")
    assert not await quota_has(world, "2.36", "floating_ips")
    put = await world.client.put(
        "/v2.1/os-quota-sets/team",
        headers=at("2.35", ADMIN),
        json={"quota_set": {"floating_ips": 3, "instances": 7}},
    )
    assert put.status_code == 200, put.text
    assert put.json()["quota_set"]["floating_ips"] == -1
    assert put.json()["quota_set"]["instances"] == 7


async def test_network_tags_work_at_2_32_only_until_2_42(world: World) -> None:
    assert await network_tag_status(world, "2.32") == 202
    assert await network_tag_status(world, "2.33") == 400
    assert await network_tag_status(world, "2.41") == 400
