"""Several servers from one request (min_count / max_count), as Nova creates them."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from shared.config import NetworkSettings
from shared.db import fixed_ips, new_servers
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_image,
    at,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

NETWORK = NetworkSettings(cidr="10.0.0.0/24")


async def post(client: httpx.AsyncClient, name: str = "web", **extra: Any) -> httpx.Response:
    body = server_body(name, **extra)
    return await client.post("/v2.1/servers", headers=at("2.73", MEMBER), json=body)


async def rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return list(
            await conn.fetch(
                """SELECT uuid, display_name, reservation_id, launch_index FROM instances
                    WHERE deleted_at IS NULL ORDER BY launch_index, created_at"""
            )
        )


async def set_instances_quota(client: httpx.AsyncClient, limit: int) -> None:
    answer = await client.put(
        "/v2.1/os-quota-sets/team", headers=ADMIN, json={"quota_set": {"instances": limit}}
    )
    assert answer.status_code == 200, answer.text


async def test_three_servers_named_numbered_and_built(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    answer = await post(client, min_count=3, max_count=3)
    assert answer.status_code == 202, answer.text
    first = answer.json()["server"]
    made = await rows(db_pool)
    assert [r["display_name"] for r in made] == ["web-1", "web-2", "web-3"]
    assert [r["launch_index"] for r in made] == [0, 1, 2]
    assert str(made[0]["uuid"]) == first["id"]
    assert len({r["reservation_id"] for r in made}) == 1
    assert made[0]["reservation_id"].startswith("r-")
    built = {(await conductor.next_build())[1] for _ in range(3)}
    assert built == {r["uuid"] for r in made}

    shown = await client.get(f"/v2.1/servers/{first['id']}", headers=at("2.3", ADMIN))
    server = shown.json()["server"]
    assert server["OS-EXT-SRV-ATTR:reservation_id"] == made[0]["reservation_id"]
    assert server["OS-EXT-SRV-ATTR:launch_index"] == 0
    by_reservation = await client.get(
        "/v2.1/servers", headers=MEMBER, params={"reservation_id": made[0]["reservation_id"]}
    )
    assert len(by_reservation.json()["servers"]) == 3
    async with db_pool.acquire() as conn:
        held = await fixed_ips.for_instances(conn, [r["uuid"] for r in made])
    assert len({ips[0].address for ips in held.values()}) == 3


async def test_a_reservation_id_is_returned_when_asked_for(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    answer = await post(client, max_count=2, return_reservation_id=True)
    assert answer.status_code == 202, answer.text
    made = await rows(db_pool)
    assert answer.json() == {"reservation_id": made[0]["reservation_id"]}
    assert len(made) == 2
    one = await post(client, "solo", return_reservation_id="true")
    assert set(one.json()) == {"reservation_id"}
    assert [r["display_name"] for r in await rows(db_pool)].count("solo") == 1


async def test_the_quota_decides_how_many_between_min_and_max(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    await set_instances_quota(client, 2)
    some = await post(client, "some", min_count=1, max_count=5)
    assert some.status_code == 202, some.text
    assert [r["display_name"] for r in await rows(db_pool)] == ["some-1", "some-2"]

    await set_instances_quota(client, 4)
    refused = await post(client, "all", min_count=3, max_count=3)
    assert refused.status_code == 403, refused.text
    message = refused.json()["forbidden"]["message"]
    assert message == "Quota exceeded for instances: Requested 3, but already used 2 of 4 instances"
    assert len(await rows(db_pool)) == 2


async def test_concurrent_requests_never_exceed_the_quota_together(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    await set_instances_quota(client, 4)
    answers = await asyncio.gather(
        *(post(client, f"race{n}", min_count=1, max_count=3) for n in range(3))
    )
    assert sorted(a.status_code for a in answers) in ([202, 202, 403], [202, 202, 202])
    assert len(await rows(db_pool)) == 4


async def test_one_address_short_creates_none(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    async with db_pool.acquire() as conn:
        await fixed_ips.ensure_network(conn, NETWORK)
        await conn.execute(
            """UPDATE fixed_ips SET instance_uuid = gen_random_uuid()
                WHERE address <> (SELECT min(address) FROM fixed_ips WHERE instance_uuid IS NULL)"""
        )
    refused = await post(client, min_count=2, max_count=2)
    assert refused.status_code == 409, refused.text
    assert await rows(db_pool) == []
    assert (await post(client)).status_code == 202


async def test_without_a_conductor_every_server_of_the_request_is_withdrawn(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_image(db_pool)
    refused = await post(client, min_count=3, max_count=3)
    assert refused.status_code == 503, refused.text
    assert await rows(db_pool) == []
    async with db_pool.acquire() as conn:
        usage = await fixed_ips.usage(conn, NETWORK.network_id)
    assert usage.free == usage.total


async def test_a_transaction_that_fails_once_creates_the_servers_once(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await add_image(db_pool)
    real = new_servers.insert
    failed: list[int] = []

    async def fails_once_on_the_second(conn: Any, new: new_servers.NewServer, **kwargs: Any) -> Any:
        if new.launch_index == 1 and not failed:
            failed.append(1)
            raise asyncpg.SerializationError("could not serialize access (injected)")
        return await real(conn, new, **kwargs)

    monkeypatch.setattr(new_servers, "insert", fails_once_on_the_second)
    answer = await post(client, min_count=3, max_count=3)
    assert answer.status_code == 202, answer.text
    assert failed == [1]
    made = await rows(db_pool)
    assert [r["display_name"] for r in made] == ["web-1", "web-2", "web-3"]
    assert len({r["reservation_id"] for r in made}) == 1
