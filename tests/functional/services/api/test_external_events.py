"""os-server-external-events: each event answered on its own (200/400/404/422), the
whole 200 or 207, accepted events recorded as instance actions and nothing else changed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.config import Settings, TokenInfo
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Faulty,
    Look,
    Recorder,
    Send,
    add_compute,
    add_image,
    at,
    every_fault,
    place_on,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional

ROUTE = "/v2.1/os-server-external-events"
SERVICE = {"X-Auth-Token": "service-token"}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    tokens = {
        **settings.auth.tokens,
        "service-token": TokenInfo(user_id="neutron", project_id="service", roles=["service"]),
    }
    return settings.model_copy(update={"auth": settings.auth.model_copy(update={"tokens": tokens})})


async def send(
    client: httpx.AsyncClient,
    events: object,
    version: str = "2.93",
    headers: dict[str, str] = ADMIN,
) -> httpx.Response:
    return await client.post(ROUTE, headers=at(version, headers), json={"events": events})


async def actions_of(pool: asyncpg.Pool, server_id: str) -> list[tuple[str, str, str | None]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT action, result, message FROM instance_actions
                WHERE instance_uuid = $1 AND action <> 'create' ORDER BY id""",
            UUID(server_id),
        )
    return [(row["action"], row["result"], row["message"]) for row in rows]


async def server_row(pool: asyncpg.Pool, server_id: str) -> dict[str, Any]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM instances WHERE uuid = $1", UUID(server_id))
    assert row is not None
    return dict(row)


@pytest.fixture
async def placed(client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder) -> str:
    """A server with a host."""
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "events-1")
    server = await create(client, "placed")
    await place_on(db_pool, server, node)
    return server


async def test_every_event_on_a_placed_server_is_accepted_and_recorded(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: str
) -> None:
    before = await server_row(db_pool, placed)
    events = [
        {"name": "network-changed", "server_uuid": placed},
        {"name": "network-vif-plugged", "server_uuid": placed, "status": "failed", "tag": "p"},
        {"name": "volume-extended", "server_uuid": placed, "tag": "vol-1"},
        {"name": "power-update", "server_uuid": placed, "tag": "POWER_OFF"},
        {"name": "volume-reimaged", "server_uuid": placed, "status": "in-progress"},
    ]
    answer = await send(client, events, headers=SERVICE)
    assert answer.status_code == 200, answer.text
    answered = answer.json()["events"]
    assert [e["code"] for e in answered] == [200] * 5
    assert [e["status"] for e in answered] == ["completed"] * 5
    assert answered[1] == {**events[1], "code": 200, "status": "completed"}
    assert "tag" not in answered[0]
    recorded = await actions_of(db_pool, placed)
    assert [(a, r) for a, r, _ in recorded] == [
        ("network-changed", "Success"),
        ("network-vif-plugged", "Error"),
        ("volume-extended", "Success"),
        ("power-update", "Success"),
        ("volume-reimaged", "Success"),
    ]
    assert "keel has no volumes" in (recorded[2][2] or "")
    assert "tag vol-1" in (recorded[2][2] or "")
    after = await server_row(db_pool, placed)
    assert {k: v for k, v in after.items() if k != "updated_at"} == {
        k: v for k, v in before.items() if k != "updated_at"
    }


async def test_failures_are_answered_per_event_with_207(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: str, conductor: Recorder
) -> None:
    unplaced = await create(client, "unplaced")
    missing = str(uuid.uuid4())
    events = [
        {"name": "network-changed", "server_uuid": placed},
        {"name": "network-changed", "server_uuid": missing},
        {"name": "power-update", "server_uuid": placed},
        {"name": "network-vif-deleted", "server_uuid": unplaced},
    ]
    answer = await send(client, events)
    assert answer.status_code == 207, answer.text
    answered = answer.json()["events"]
    assert [(e["code"], e["status"]) for e in answered] == [
        (200, "completed"),
        (404, "failed"),
        (400, "failed"),
        (422, "failed"),
    ]
    assert [a for a, _, _ in await actions_of(db_pool, placed)] == ["network-changed"]
    assert await actions_of(db_pool, unplaced) == []
    none_found = await send(client, [{"name": "network-changed", "server_uuid": missing}])
    assert none_found.status_code == 207
    assert none_found.json()["events"][0]["code"] == 404


async def test_the_same_events_twice_at_once_are_both_recorded(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: str
) -> None:
    events = [{"name": "network-changed", "server_uuid": placed}]
    answers = await asyncio.gather(send(client, events), send(client, events))
    assert [a.status_code for a in answers] == [200, 200]
    recorded = await actions_of(db_pool, placed)
    assert [(a, r) for a, r, _ in recorded] == [("network-changed", "Success")] * 2


@pytest.mark.parametrize(
    ("name", "since"),
    [
        ("volume-extended", "2.51"),
        ("power-update", "2.76"),
        ("accelerator-request-bound", "2.82"),
        ("volume-reimaged", "2.93"),
    ],
)
async def test_event_names_follow_the_microversion(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: str, name: str, since: str
) -> None:
    event = [{"name": name, "server_uuid": placed, "tag": "t"}]
    major, minor = since.split(".")
    below = await send(client, event, f"{major}.{int(minor) - 1}")
    assert below.status_code == 400, below.text
    assert await actions_of(db_pool, placed) == []
    assert (await send(client, event, since)).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"events": []},
        {"events": {}},
        {"events": [{"name": "network-changed"}]},
        {"events": [{"name": "bogus", "server_uuid": "00000000-0000-0000-0000-000000000000"}]},
        {"events": [{"name": "network-changed", "server_uuid": "not-a-uuid"}]},
        {"events": [{"name": "network-changed", "server_uuid": 7}]},
        {"events": [{"name": "network-changed", "server_uuid": "PLACED", "status": "done"}]},
        {"events": [{"name": "network-changed", "server_uuid": "PLACED", "tag": "x" * 256}]},
        {"events": [{"name": "network-changed", "server_uuid": "PLACED", "extra": 1}]},
        {"events": ["network-changed"]},
        {"event": []},
        [],
    ],
)
async def test_bad_bodies_are_400_and_record_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: str, body: Any
) -> None:
    if isinstance(body, dict) and isinstance(body.get("events"), list):
        for event in body["events"]:
            if isinstance(event, dict) and event.get("server_uuid") == "PLACED":
                event["server_uuid"] = placed
    answer = await client.post(ROUTE, headers=at("2.93", ADMIN), json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["badRequest"]["message"]
    assert await actions_of(db_pool, placed) == []


async def test_members_are_refused(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, placed: str
) -> None:
    refused = await send(
        client, [{"name": "network-changed", "server_uuid": placed}], headers=MEMBER
    )
    assert refused.status_code == 403
    assert await actions_of(db_pool, placed) == []


@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_events_whose_database_call_fails_once_are_all_recorded_or_none_then_again(
    client: httpx.AsyncClient, faulty: Faulty, db_pool: asyncpg.Pool, placed: str, answered: bool
) -> None:
    """Each database call failing in turn: 503, then every event of the request is
    recorded (and finished) or none is; sent again, each is recorded (once more, if the
    first took effect: each delivery is one record)."""
    names = ("network-vif-plugged", "volume-extended", "power-update")

    async def write(tag: str) -> tuple[Send, Look]:
        events = [{"name": name, "server_uuid": placed, "tag": tag} for name in names]

        async def post(c: httpx.AsyncClient) -> httpx.Response:
            return await send(c, events)

        async def look() -> tuple[frozenset[str], bool, int]:
            async with db_pool.acquire() as conn:
                rows = await conn.fetch(
                    """SELECT action, count(*) AS n FROM instance_actions
                        WHERE instance_uuid = $1 AND message LIKE $2 GROUP BY action""",
                    UUID(placed),
                    f"%(tag {tag}):%",
                )
                unfinished = await conn.fetchval(
                    """SELECT count(*) FROM instance_actions
                        WHERE instance_uuid = $1 AND finish_time IS NULL AND action <> 'create'""",
                    UUID(placed),
                )
            counts = {row["action"]: row["n"] for row in rows}
            return frozenset(counts), len(set(counts.values())) <= 1, unfinished

        return post, look

    numbered = await every_fault(faulty, client, answered, write, done=200)
    assert numbered >= (1 if answered else 5)
