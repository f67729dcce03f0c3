"""``/v2.1/os-keel-host-tasks``: keel-api in-process against real PostgreSQL and RabbitMQ.

Admins start, list and show host tasks; everyone else gets 403; bad input a clear 400
(never a 500); a second start resumes the running task.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from shared.config import FencingSettings, Settings
from tests.functional.services.api.conftest import ADMIN, MEMBER, add_compute

pytestmark = pytest.mark.functional

PATH = "/v2.1/os-keel-host-tasks"
DRAIN = {"kind": "drain", "host": "ht-a", "cold_fallback": True, "parallel": 3}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"service_down_time": 4.0, "fencing": FencingSettings(margin=2.0)}
    )


async def post(
    client: httpx.AsyncClient, body: Any, headers: dict[str, str] = ADMIN
) -> httpx.Response:
    return await client.post(PATH, json=body, headers=headers)


def fault(response: httpx.Response) -> str:
    ((_, inner),) = response.json().items()
    message: str = inner["message"]
    return message


async def test_an_admin_starts_a_drain_and_starting_again_resumes_it(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "ht-a")

    first, again = await asyncio.gather(
        post(client, {"host_task": DRAIN}),
        post(client, {"host_task": {**DRAIN, "parallel": 9}}),
    )

    assert sorted([first.status_code, again.status_code]) == [200, 202]
    one, two = first.json()["host_task"], again.json()["host_task"]
    assert one["id"] == two["id"]
    assert (one["kind"], one["host"], one["status"]) == ("drain", "ht-a", "running")
    assert one["parallel"] == two["parallel"], "the resumed task keeps its own settings"
    listed = (await client.get(PATH, headers=ADMIN)).json()["host_tasks"]
    assert [t["id"] for t in listed] == [one["id"]]
    shown = await client.get(f"{PATH}/{one['id']}", headers=ADMIN)
    assert shown.status_code == 200
    assert shown.json()["host_task"]["items"] == []
    by_number = await client.get(f"{PATH}/{one['number']}", headers=ADMIN)
    assert by_number.json()["host_task"]["id"] == one["id"]


async def test_members_are_refused_and_see_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "ht-a")
    for response in (
        await post(client, {"host_task": DRAIN}, MEMBER),
        await client.get(PATH, headers=MEMBER),
        await client.get(f"{PATH}/1", headers=MEMBER),
    ):
        assert response.status_code == 403, response.text
        assert "admin role" in fault(response)
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM host_tasks") == 0


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (None, 400, "The body must be"),
        ({"host_task": "drain"}, 400, "Invalid input for field/attribute host_task"),
        ({"host_task": {**DRAIN, "kind": "reboot"}}, 400, "field/attribute kind"),
        ({"host_task": {**DRAIN, "parallel": 0}}, 400, "field/attribute parallel"),
        ({"host_task": {**DRAIN, "parallel": 10**6}}, 400, "parallel must be between 1 and"),
        ({"host_task": {**DRAIN, "deadline": -5}}, 400, "field/attribute deadline"),
        ({"host_task": {**DRAIN, "extra": 1}}, 400, "field/attribute extra"),
        ({"host_task": {**DRAIN, "host": "nowhere"}}, 404, "Compute host nowhere could not"),
        ({"host_task": {**DRAIN, "cold_fallback": "maybe"}}, 400, "field/attribute cold_fallback"),
        ({"host_task": {"kind": "evacuate", "host": "ht-a"}}, 400, "is still in use"),
        ({"host_task": {"kind": "drain", "host": "ht-down", "cold_fallback": True}}, 409, "down"),
    ],
)
async def test_bad_requests_get_a_clear_4xx_and_record_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, body: Any, status: int, says: str
) -> None:
    await add_compute(db_pool, "ht-a")
    await add_compute(db_pool, "ht-down", up=False)

    response = await post(client, body)

    assert response.status_code == status, response.text
    assert says in fault(response)
    async with db_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM host_tasks") == 0


async def test_the_other_kind_conflicts_and_unknown_tasks_are_404(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "ht-a")
    started = (await post(client, {"host_task": DRAIN})).json()["host_task"]
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET forced_down = true WHERE host = 'ht-a'")

    other = await post(client, {"host_task": {"kind": "evacuate", "host": "ht-a"}})

    assert other.status_code == 409
    assert f"host task {started['number']} (drain) runs on it" in fault(other)
    for ref in ("999999", "not-a-task", "7" * 40):
        missing = await client.get(f"{PATH}/{ref}", headers=ADMIN)
        assert missing.status_code == 404, missing.text
    assert (await client.get(f"{PATH}?all=maybe", headers=ADMIN)).status_code == 400
