"""``injectNetworkInfo``: an admin's request, recorded as an instance action, that changes
nothing in keel (the addresses never change; the metadata service reads them live)."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.servers.inject_network_info import NOTHING_TO_DO
from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional

INJECT = {"injectNetworkInfo": None}


async def recorded(pool: asyncpg.Pool, server_id: str) -> list[tuple[str, str, str | None]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT user_id, result, message FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'injectNetworkInfo' ORDER BY id""",
            UUID(server_id),
        )
    return [(row["user_id"], row["result"], row["message"]) for row in rows]


async def server_row(pool: asyncpg.Pool, server_id: str) -> dict[str, object]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM instances WHERE uuid = $1", UUID(server_id))
    assert row is not None
    return {k: v for k, v in dict(row).items() if k != "updated_at"}


async def test_an_admin_injects_it_is_recorded_and_nothing_changes(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client)
    before = await server_row(db_pool, server)
    answer = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=INJECT)
    assert answer.status_code == 202, answer.text
    assert answer.content == b""
    assert await recorded(db_pool, server) == [("root", "Success", NOTHING_TO_DO)]
    assert await server_row(db_pool, server) == before
    actions = await client.get(
        f"/v2.1/servers/{server}/os-instance-actions", headers=at("2.51", MEMBER)
    )
    assert "injectNetworkInfo" in [a["action"] for a in actions.json()["instanceActions"]]


async def test_two_at_once_are_both_accepted_and_recorded(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client)
    path = f"/v2.1/servers/{server}/action"
    answers = await asyncio.gather(*(client.post(path, headers=ADMIN, json=INJECT) for _ in "ab"))
    assert [a.status_code for a in answers] == [202, 202]
    assert [result for _, result, _ in await recorded(db_pool, server)] == ["Success"] * 2


@pytest.mark.parametrize("value", [{}, "yes", 1, []])
async def test_any_value_is_taken_as_nova_takes_it(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder, value: object
) -> None:
    await add_image(db_pool)
    server = await create(client)
    answer = await client.post(
        f"/v2.1/servers/{server}/action", headers=ADMIN, json={"injectNetworkInfo": value}
    )
    assert answer.status_code == 202, answer.text
    assert len(await recorded(db_pool, server)) == 1


async def test_another_key_beside_it_is_400_and_records_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client)
    answer = await client.post(
        f"/v2.1/servers/{server}/action", headers=ADMIN, json={**INJECT, "extra": None}
    )
    assert answer.status_code == 400, answer.text
    assert await recorded(db_pool, server) == []


async def test_members_are_refused_and_unknown_servers_are_404(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    server = await create(client)
    refused = await client.post(f"/v2.1/servers/{server}/action", headers=MEMBER, json=INJECT)
    assert refused.status_code == 403
    assert "inject_network_info" in refused.json()["forbidden"]["message"]
    assert await recorded(db_pool, server) == []
    missing = await client.post(
        "/v2.1/servers/00000000-0000-0000-0000-000000000000/action", headers=ADMIN, json=INJECT
    )
    assert missing.status_code == 404
