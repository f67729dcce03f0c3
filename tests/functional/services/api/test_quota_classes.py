"""os-quota-class-sets: the default class overrides the settings' defaults, for every
keel-api at once, and quota checks use it."""

from __future__ import annotations

import asyncio

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
    Faulty,
    Look,
    Recorder,
    Send,
    add_image,
    at,
    every_fault,
)
from tests.functional.services.api.test_quotas import DEFAULTS, INJECTED, create_server

pytestmark = pytest.mark.functional

NETWORK = {"fixed_ips": -1, "floating_ips": -1, "security_group_rules": -1, "security_groups": -1}
BASE = {k: v for k, v in DEFAULTS.items() if not k.startswith("server_group")}
GROUPS = {k: v for k, v in DEFAULTS.items() if k.startswith("server_group")}


async def put_class(
    client: httpx.AsyncClient, version: str, name: str = "default", **limits: object
) -> httpx.Response:
    return await client.put(
        f"/v2.1/os-quota-class-sets/{name}",
        headers=at(version, ADMIN),
        json={"quota_class_set": limits},
    )


async def show_class(
    client: httpx.AsyncClient, version: str, name: str = "default", headers: dict[str, str] = ADMIN
) -> httpx.Response:
    return await client.get(f"/v2.1/os-quota-class-sets/{name}", headers=at(version, headers))


async def test_the_resources_shown_follow_the_microversion(client: httpx.AsyncClient) -> None:
    old = await show_class(client, "2.1")
    assert old.status_code == 200, old.text
    assert old.json()["quota_class_set"] == {"id": "default", **BASE, **INJECTED, **NETWORK}
    at_250 = await show_class(client, "2.50")
    assert at_250.json()["quota_class_set"] == {"id": "default", **DEFAULTS, **INJECTED}
    at_257 = await show_class(client, "2.57")
    assert at_257.json()["quota_class_set"] == {"id": "default", **DEFAULTS}


async def test_the_default_class_becomes_every_projects_default(
    client: httpx.AsyncClient,
) -> None:
    updated = await put_class(client, "2.57", instances=3, cores="7", server_groups=-1)
    assert updated.status_code == 200, updated.text
    assert updated.json()["quota_class_set"] == {
        **DEFAULTS,
        "instances": 3,
        "cores": 7,
        "server_groups": -1,
    }
    shown = await show_class(client, "2.57")
    assert shown.json()["quota_class_set"]["instances"] == 3
    defaults = await client.get("/v2.1/os-quota-sets/team/defaults", headers=at("2.57", MEMBER))
    assert defaults.json()["quota_set"]["instances"] == 3
    project = await client.get("/v2.1/os-quota-sets/team", headers=at("2.57", MEMBER))
    assert project.json()["quota_set"]["cores"] == 7
    limits = await client.get("/v2.1/limits", headers=MEMBER)
    assert limits.json()["limits"]["absolute"]["maxTotalInstances"] == 3
    # A project's own limit still wins over the class.
    own = await client.put(
        "/v2.1/os-quota-sets/team",
        headers=at("2.57", ADMIN),
        json={"quota_set": {"instances": 5}},
    )
    assert own.json()["quota_set"]["instances"] == 5


async def test_before_2_50_network_limits_are_kept_and_groups_settable(
    client: httpx.AsyncClient,
) -> None:
    updated = await put_class(client, "2.1", floating_ips=110, server_group_members=4)
    assert updated.status_code == 200, updated.text
    body = updated.json()["quota_class_set"]
    assert body["floating_ips"] == 110
    assert "server_group_members" not in body
    later = await show_class(client, "2.50")
    assert later.json()["quota_class_set"]["server_group_members"] == 4
    assert "floating_ips" not in later.json()["quota_class_set"]


async def test_other_classes_are_stored_and_change_no_default(client: httpx.AsyncClient) -> None:
    assert (await put_class(client, "2.57", "gold", instances=99)).status_code == 200
    assert (await show_class(client, "2.57", "gold")).json()["quota_class_set"]["instances"] == 99
    defaults = await client.get("/v2.1/os-quota-sets/team/defaults", headers=at("2.57", MEMBER))
    assert defaults.json()["quota_set"]["instances"] == DEFAULTS["instances"]


async def test_every_keel_api_agrees(
    client: httpx.AsyncClient, settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> None:
    other = create_app(settings, db_pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=other), base_url="http://keel-2.test"
    ) as second:
        assert (await put_class(client, "2.57", key_pairs=7)).status_code == 200
        seen = await show_class(second, "2.57")
    assert seen.json()["quota_class_set"]["key_pairs"] == 7


async def test_quota_checks_use_the_default_class(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    assert (await put_class(client, "2.57", instances=1)).status_code == 200
    assert (await create_server(client, "first")).status_code == 202
    refused = await create_server(client, "second")
    assert refused.status_code == 403
    assert "already used 1 of 1 instances" in refused.json()["forbidden"]["message"]


async def test_the_same_update_twice_at_once(client: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(
        put_class(client, "2.57", instances=4, ram=1024),
        put_class(client, "2.57", instances=4, ram=1024),
    )
    assert [a.status_code for a in answers] == [200, 200]
    assert all(a.json()["quota_class_set"]["instances"] == 4 for a in answers)
    shown = (await show_class(client, "2.57")).json()["quota_class_set"]
    assert (shown["instances"], shown["ram"]) == (4, 1024)


async def test_members_may_neither_read_nor_set_a_class(client: httpx.AsyncClient) -> None:
    read = await show_class(client, "2.57", headers=MEMBER)
    assert read.status_code == 403
    written = await client.put(
        "/v2.1/os-quota-class-sets/default",
        headers=at("2.57", MEMBER),
        json={"quota_class_set": {"instances": 50}},
    )
    assert written.status_code == 403
    assert (await show_class(client, "2.57")).json()["quota_class_set"]["instances"] == 10


@pytest.mark.parametrize(
    ("version", "body"),
    [
        ("2.57", {"quota_class_set": {"instances": -2}}),
        ("2.57", {"quota_class_set": {"ram": 2**31}}),
        ("2.57", {"quota_class_set": {"cores": "lots"}}),
        ("2.57", {"quota_class_set": {"cores": True}}),
        ("2.57", {"quota_class_set": {"bogus": 1}}),
        ("2.57", {"quota_class_set": {"injected_files": 3}}),
        ("2.50", {"quota_class_set": {"floating_ips": 3}}),
        ("2.57", {"quota_class_set": {"force": True}}),
        ("2.57", {"quota_class_set": []}),
        ("2.57", {"quota_set": {"instances": 1}}),
        ("2.57", []),
    ],
)
async def test_bad_updates_are_400_and_change_nothing(
    client: httpx.AsyncClient, version: str, body: object
) -> None:
    response = await client.put(
        "/v2.1/os-quota-class-sets/default", headers=at(version, ADMIN), json=body
    )
    assert response.status_code == 400, response.text
    assert response.json()["badRequest"]["message"]
    assert (await show_class(client, "2.57")).json()["quota_class_set"] == {
        "id": "default",
        **DEFAULTS,
    }


async def test_bad_class_names_and_bodies_are_400(client: httpx.AsyncClient) -> None:
    too_long = await put_class(client, "2.57", "x" * 256, instances=1)
    assert too_long.status_code == 400
    not_json = await client.put(
        "/v2.1/os-quota-class-sets/default", headers=at("2.57", ADMIN), content=b"{"
    )
    assert not_json.status_code == 400
    query = await client.get("/v2.1/os-quota-class-sets/default?x=1", headers=at("2.102", ADMIN))
    assert query.status_code == 400


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_class_set_whose_database_call_fails_once_is_whole_or_absent_and_repeats(
    client: httpx.AsyncClient, faulty: Faulty, db_pool: asyncpg.Pool, answered: bool
) -> None:
    """Each database call of a PUT failing in turn: 503, then the class has all of the
    limits it sets or none of them, and the PUT sent again sets them all."""

    async def write(name: str) -> tuple[Send, Look]:
        async def put(c: httpx.AsyncClient) -> httpx.Response:
            return await put_class(c, "2.57", name, cores=7, ram=4096, instances=3)

        async def look() -> set[tuple[str, int]]:
            async with db_pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT resource, hard_limit FROM quota_classes WHERE class_name = $1", name
                )
            return {(row["resource"], row["hard_limit"]) for row in rows}

        return put, look

    numbered = await every_fault(faulty, client, answered, write, done=200)
    assert numbered >= (1 if answered else 5)
