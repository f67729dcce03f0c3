"""``host``/``hypervisor_hostname`` on server create (2.74), the forced zone form, and
policies: what keel-api accepts, refuses, and hands to the conductor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.rpc.amqp import AmqpTransport
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional


async def post(
    client: httpx.AsyncClient,
    version: str = "2.74",
    headers: dict[str, str] = ADMIN,
    **fields: Any,
) -> httpx.Response:
    return await client.post(
        "/v2.1/servers", headers=at(version, headers), json=server_body(**fields)
    )


async def server_rows(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM instances")
    return count


@pytest.fixture
async def cloud(db_pool: asyncpg.Pool) -> dict[str, int]:
    """Hosts a and b in zone nova, c in zone z2; each node named after its host."""
    await add_image(db_pool)
    nodes = {}
    for host, zone in (("a", "nova"), ("b", "nova"), ("c", "z2")):
        _, node = await add_compute(db_pool, host, zone=zone)
        nodes[host] = node.id
    return nodes


async def test_host_node_and_both_reach_the_conductor_as_node_ids(
    client: httpx.AsyncClient, conductor: Recorder, cloud: dict[str, int], db_pool: asyncpg.Pool
) -> None:
    destinations: list[dict[str, Any]] = [
        {"host": "b"},
        {"hypervisor_hostname": "b"},
        {"host": "b", "hypervisor_hostname": "b"},
    ]
    for fields in destinations:
        response = await post(client, **fields)
        assert response.status_code == 202, response.text
        _, instance_uuid = await conductor.next_build()
        destination = conductor.destinations[instance_uuid]
        assert destination is not None
        assert destination.node_ids == [cloud["b"]]
        assert not destination.forced
        assert (destination.host, destination.node) == (
            fields.get("host"),
            fields.get("hypervisor_hostname"),
        )
    # Never stored with the request spec: later moves choose freely.
    async with db_pool.acquire() as conn:
        specs = await conn.fetch("SELECT spec FROM request_specs")
    assert specs
    assert all("requested_destination" not in row["spec"] for row in specs)


async def test_a_create_without_a_destination_carries_none(
    client: httpx.AsyncClient, conductor: Recorder, cloud: dict[str, int]
) -> None:
    response = await post(client)
    assert response.status_code == 202
    _, instance_uuid = await conductor.next_build()
    assert conductor.destinations[instance_uuid] is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"host": "nowhere"}, "Compute host nowhere could not be found."),
        (
            {"hypervisor_hostname": "nowhere"},
            "Compute host with hypervisor hostname nowhere could not be found.",
        ),
        (
            {"host": "a", "hypervisor_hostname": "b"},
            "Compute host a with hypervisor hostname b could not be found.",
        ),
        ({"host": "b", "availability_zone": "nova:b"}, "mutually exclusive"),
        ({"hypervisor_hostname": "b", "availability_zone": "nova::b"}, "mutually exclusive"),
        ({"host": "bad host"}, "server.host"),
        ({"host": ""}, "server.host"),
        ({"host": "x" * 256}, "server.host"),
        ({"hypervisor_hostname": "a\u0000"}, ""),
        ({"availability_zone": "nova:a:a:a"}, "Invalid availability_zone"),
        ({"availability_zone": "nova:nowhere"}, "Compute host nowhere could not be found."),
    ],
)
async def test_bad_destinations_are_400_and_write_nothing(
    *,
    client: httpx.AsyncClient,
    conductor: Recorder,
    cloud: dict[str, int],
    db_pool: asyncpg.Pool,
    fields: dict[str, Any],
    message: str,
) -> None:
    response = await post(client, **fields)
    assert response.status_code == 400, response.text
    assert message in response.json()["badRequest"]["message"]
    assert await server_rows(db_pool) == 0


async def test_below_2_74_host_is_an_additional_property(
    client: httpx.AsyncClient, conductor: Recorder, cloud: dict[str, int], db_pool: asyncpg.Pool
) -> None:
    for headers in (ADMIN, MEMBER):
        response = await post(client, "2.73", headers, host="b")
        assert response.status_code == 400
        assert "'host' unexpected" in response.json()["badRequest"]["message"]
    assert await server_rows(db_pool) == 0


async def test_members_may_not_request_a_destination(
    client: httpx.AsyncClient, conductor: Recorder, cloud: dict[str, int], db_pool: asyncpg.Pool
) -> None:
    for fields in ({"host": "b"}, {"hypervisor_hostname": "b"}, {"availability_zone": "nova:b"}):
        response = await post(client, headers=MEMBER, **fields)
        assert response.status_code == 403, fields
        assert "Policy doesn't allow" in response.json()["forbidden"]["message"]
    assert await server_rows(db_pool) == 0


async def test_the_forced_form_is_forced_and_the_zone_is_its_zone_part(
    client: httpx.AsyncClient, conductor: Recorder, cloud: dict[str, int]
) -> None:
    for zone, node_id in (("z2:c", cloud["c"]), ("nova:b:b", cloud["b"]), ("nova::a", cloud["a"])):
        response = await post(client, availability_zone=zone)
        assert response.status_code == 202, response.text
        _, instance_uuid = await conductor.next_build()
        destination = conductor.destinations[instance_uuid]
        assert destination is not None
        assert destination.forced
        assert destination.node_ids == [node_id]
        shown = await client.get(f"/v2.1/servers/{instance_uuid}", headers=ADMIN)
        assert shown.json()["server"]["OS-EXT-AZ:availability_zone"] == zone.split(":")[0]


async def test_a_zone_alone_still_works_for_members(
    client: httpx.AsyncClient, conductor: Recorder, cloud: dict[str, int]
) -> None:
    response = await post(client, "2.74", MEMBER, availability_zone="z2")
    assert response.status_code == 202
    _, instance_uuid = await conductor.next_build()
    assert conductor.destinations[instance_uuid] is None


async def test_a_policy_file_opens_destinations_to_members(
    *,
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    conductor: Recorder,
    cloud: dict[str, int],
    tmp_path: Path,
) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        '"os_compute_api:servers:create:requested_destination": '
        '"role:admin or project_id:%(project_id)s"\n'
    )
    settings.api.policy_file = policy_file
    app = create_app(settings, db_pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as member_client:
        allowed = await post(member_client, headers=MEMBER, host="b")
        forced = await post(member_client, headers=MEMBER, availability_zone="nova:b")
    assert allowed.status_code == 202, allowed.text
    assert forced.status_code == 403


async def test_a_conductor_pinned_below_1_6_is_409_before_anything_is_written(
    settings: Settings,
    db_pool: asyncpg.Pool,
    transport: AmqpTransport,
    conductor: Recorder,
    cloud: dict[str, int],
) -> None:
    app = create_app(
        settings, db_pool, ConductorAPI(transport, version_cap="1.5"), ComputeAPI(transport)
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as old:
        refused = await post(old, host="b")
        plain = await post(old)
    assert refused.status_code == 409
    assert "1.6" in refused.json()["conflictingRequest"]["message"]
    assert plain.status_code == 202
    assert await server_rows(db_pool) == 1
