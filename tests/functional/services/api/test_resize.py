"""The ``resize`` action through keel-api: what it refuses, and what it records."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import instances
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    OTHER_MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


@pytest.fixture
async def server(client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder) -> str:
    """The member's ACTIVE m1.tiny server on host-a (its agent up), host-b beside it."""
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "host-a")
    await add_compute(db_pool, "host-b")
    server_id = await create(client)
    await place_on(db_pool, server_id, node)
    async with db_pool.acquire() as conn:
        await instances.set_active(conn, UUID(server_id))
    return server_id


async def resize(
    client: httpx.AsyncClient, server: str, value: Any, headers: dict[str, str] = MEMBER
) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server}/action", headers=at("2.74", headers), json={"resize": value}
    )


async def records(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await conn.fetch("SELECT * FROM migrations ORDER BY id")


async def test_a_resize_is_recorded_with_both_flavors(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    response = await resize(client, server, {"flavorRef": "2", "OS-DCF:diskConfig": "AUTO"})

    assert response.status_code == 202, response.text
    [record] = await records(db_pool)
    assert (record["migration_type"], record["status"], record["source_compute"]) == (
        "resize",
        "accepted",
        "host-a",
    )
    assert (record["old_flavor"]["flavorid"], record["new_flavor"]["flavorid"]) == ("1", "2")
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, UUID(server))
    assert shown.task_state == "resize_prep"


@pytest.mark.parametrize(
    ("value", "status", "message"),
    [
        ({"flavorRef": "1"}, 400, "When resizing, instances must change flavor!"),
        ({"flavorRef": "99"}, 400, "Flavor 99 could not be found."),
        ({"flavorRef": ""}, 400, "flavorRef"),
        ({"flavorRef": True}, 400, "flavorRef"),
        ({}, 400, "flavorRef"),
        ({"flavorRef": "2", "other": 1}, 400, "additional properties"),
        ({"flavorRef": "2", "OS-DCF:diskConfig": "SOMETIMES"}, 400, "diskConfig"),
        ("2", 400, "it must be an object"),
        (None, 400, "it must be an object"),
    ],
)
async def test_bad_resizes_are_refused_and_record_nothing(
    client: httpx.AsyncClient,
    *,
    db_pool: asyncpg.Pool,
    server: str,
    value: Any,
    status: int,
    message: str,
) -> None:
    response = await resize(client, server, value)

    assert response.status_code == status, response.text
    assert message in response.text
    assert await records(db_pool) == []


async def test_a_smaller_disk_another_project_and_a_quota_are_refused(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET flavor = flavor || '{"root_gb": 40}'::jsonb
                WHERE uuid = $1""",
            UUID(server),
        )
    smaller = await resize(client, server, {"flavorRef": "2"})
    assert smaller.status_code == 400
    assert "Unable to resize disk down" in smaller.text
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET flavor = flavor || '{\"root_gb\": 1}'::jsonb WHERE uuid = $1",
            UUID(server),
        )

    assert (await resize(client, server, {"flavorRef": "2"}, OTHER_MEMBER)).status_code == 404

    limited = await client.put(
        "/v2.1/os-quota-sets/team", headers=at("2.57", ADMIN), json={"quota_set": {"ram": 2000}}
    )
    assert limited.status_code == 200, limited.text
    over = await resize(client, server, {"flavorRef": "2"})
    assert over.status_code == 403, over.text
    assert "ram" in over.text
    assert await records(db_pool) == []


async def test_two_resizes_at_once_record_one(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    first, second = await asyncio.gather(
        resize(client, server, {"flavorRef": "2"}), resize(client, server, {"flavorRef": "3"})
    )

    assert sorted([first.status_code, second.status_code]) == [202, 409]
    assert len(await records(db_pool)) == 1


async def test_resizes_being_made_count_against_the_quota(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    """Two servers resized up at once may not overrun the quota between them."""
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "host-q")
    await add_compute(db_pool, "host-r")
    servers = [await create(client, f"q-{n}") for n in range(2)]
    for server_id in servers:
        await place_on(db_pool, server_id, node)
        async with db_pool.acquire() as conn:
            await instances.set_active(conn, UUID(server_id))
    # Two m1.tiny (1,024 MB) in use: room for one resize to m1.small (+1,536), not two.
    limited = await client.put(
        "/v2.1/os-quota-sets/team", headers=at("2.57", ADMIN), json={"quota_set": {"ram": 3000}}
    )
    assert limited.status_code == 200, limited.text

    answers = await asyncio.gather(*(resize(client, s, {"flavorRef": "2"}) for s in servers))

    assert sorted(a.status_code for a in answers) == [202, 403]
