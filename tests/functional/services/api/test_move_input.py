"""Hostile and malformed input to the move actions and the migration lists: 4xx faults.

Whatever the body or query, keel answers with a Nova-shaped 4xx fault whose message can
be encoded, never a 500, and never records a migration for a refused request.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.db import instances, services
from shared.metrics import Metrics
from shared.rpc.amqp import AmqpTransport
from shared.version_pins import Pins
from shared.versions import SERVICE_VERSION
from tests.functional.services.api.conftest import (
    ADMIN,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

VERSIONS = ("2.1", "2.14", "2.29", "2.56", "2.68", "2.73", "2.74")

BODIES: list[Any] = [
    {"evacuate": None},
    {"evacuate": "host-b"},
    {"evacuate": []},
    {"evacuate": {"host": "\u0000"}},
    {"evacuate": {"host": "bad\u0000host"}},
    {"evacuate": {"host": 42}},
    {"evacuate": {"host": "h" * 300}},
    {"evacuate": {"host": ""}},
    {"evacuate": {"host": "\ud800"}},
    {"evacuate": {"adminPass": 5}},
    {"evacuate": {"adminPass": "x\u0000"}},
    {"evacuate": {"onSharedStorage": "maybe"}},
    {"evacuate": {"force": "yes"}},
    {"evacuate": {"unknown": 1}},
    # Nova takes any value for these; with nothing to confirm or revert they are refused.
    {"confirmResize": {"x": 1}},
    {"confirmResize": "now"},
    {"revertResize": [1]},
    {"revertResize": {"\u0000": 1}},
]

#: Refused from 2.56, where ``migrate`` takes a host; below it Nova ignores the value.
MIGRATE_BODIES: list[Any] = [
    {"migrate": "host-b"},
    {"migrate": {"host": "\u0000"}},
    {"migrate": {"host": ""}},
    {"migrate": {"host": 2**40}},
    {"migrate": {"host": "h" * 300}},
    {"migrate": {"unknown": True}},
    {"migrate": []},
]

QUERIES = [
    "limit=-1",
    "limit=abc",
    "limit=99999999999999999999999",
    "marker=not-a-uuid",
    "marker=00000000-0000-4000-8000-000000000000",
    "instance_uuid=%00",
    "instance_uuid=not-a-uuid",
    "host=%00",
    "status=%00",
    "source_compute=a%00b",
    "migration_type=%00",
    "migration_type=bogus",
    "changes-since=garbage",
    "changes-since=9999-99-99T99:99:99",
    "changes-before=2020-01-01T00:00:00Z&changes-since=2021-01-01T00:00:00Z",
    "user_id=%00",
    "project_id=%00",
    "hidden=%ff%fe",
]


def _minor(version: str) -> int:
    return int(version.partition(".")[2])


def shaped(response: httpx.Response) -> None:
    """A 4xx (or 2xx) answer; a fault carries ``{name: {code, message}}``."""
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        (body,) = response.json().values()
        assert body["code"] == response.status_code
        body["message"].encode("utf-8")


@pytest.fixture
async def server(client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder) -> str:
    """An ACTIVE server on host-a (its agent up) with host-b beside it."""
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "host-a")
    await add_compute(db_pool, "host-b")
    response = await client.post("/v2.1/servers", headers=ADMIN, json=server_body(name="mover"))
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    await place_on(db_pool, server_id, node)
    async with db_pool.acquire() as conn:
        await instances.set_active(conn, UUID(server_id))
    return server_id


async def test_malformed_move_bodies_are_refused_with_faults_and_no_record(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    tried = [(v, b) for v in VERSIONS for b in BODIES]
    tried += [(v, b) for v in VERSIONS if _minor(v) >= 56 for b in MIGRATE_BODIES]
    for version, body in tried:
        response = await client.post(
            f"/v2.1/servers/{server}/action",
            headers={**at(version), "Content-Type": "application/json"},
            content=json.dumps(body),  # ASCII: lone surrogates travel escaped
        )
        shaped(response)
        assert response.status_code >= 400, (version, body, response.text)
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM migrations") == 0


async def test_hostile_migration_list_queries_are_answered_with_faults(
    client: httpx.AsyncClient, server: str
) -> None:
    for version in VERSIONS:
        for query in QUERIES:
            shaped(await client.get(f"/v2.1/os-migrations?{query}", headers=at(version)))
            shaped(
                await client.get(f"/v2.1/servers/{server}/migrations?{query}", headers=at(version))
            )
        shaped(await client.get(f"/v2.1/servers/{server}/migrations/1", headers=at(version)))
        shaped(await client.get(f"/v2.1/servers/{server}/migrations/%00", headers=at(version)))
        shaped(
            await client.get(f"/v2.1/servers/{server}/os-instance-actions/%00", headers=at(version))
        )


async def test_evacuate_with_an_agent_older_than_evacuation_is_409_and_writes_nothing(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport, conductor: Recorder
) -> None:
    """Finding 5: the compute RPC cap is checked before anything is recorded."""
    await add_image(db_pool)
    source, node = await add_compute(db_pool, "host-a")
    target, _ = await add_compute(db_pool, "host-b")
    old, _ = await add_compute(db_pool, "host-old")
    async with db_pool.acquire() as conn:
        for service in (source, target):
            await services.heartbeat(conn, service.uuid, SERVICE_VERSION)
        # Release 4 (davit) knew no rebuild_instance: the compute cap falls below 1.2.
        await services.heartbeat(conn, old.uuid, 4)
    pins = Pins.build(db_pool, settings, Metrics())
    app = create_app(
        settings,
        db_pool,
        ConductorAPI(transport, version_cap=pins.conductor.cap),
        ComputeAPI(transport, version_cap=pins.compute.cap),
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as client:
        created = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())
        server_id = created.json()["server"]["id"]
        await place_on(db_pool, server_id, node)
        async with db_pool.acquire() as conn:
            await instances.set_active(conn, UUID(server_id))
            await conn.execute("UPDATE services SET forced_down = true WHERE id = $1", source.id)

        response = await client.post(
            f"/v2.1/servers/{server_id}/action", headers=ADMIN, json={"evacuate": {}}
        )

    assert response.status_code == 409, response.text
    message = response.json()["conflictingRequest"]["message"]
    assert "host-old (release davit)" in message
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM migrations") == 0
        instance = await instances.get(conn, UUID(server_id))
        actions = await conn.fetchval(
            "SELECT count(*) FROM instance_actions WHERE action = 'evacuate'"
        )
    assert (instance.vm_state, instance.task_state) == ("active", None)
    assert actions == 0
