"""``DELETE /os-services/{id}``: a stopped service and its node go, unless they host servers."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


async def _rows(pool: asyncpg.Pool) -> list[str]:
    async with pool.acquire() as conn:
        return [
            row[0]
            for table in ("services", "compute_nodes", "instances", "allocations")
            for row in await conn.fetch(f"SELECT to_jsonb(t)::text FROM {table} t ORDER BY id")
        ]


async def test_a_stopped_empty_compute_service_is_deleted_with_its_node(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    service, node = await add_compute(db_pool, "compute-1", up=False)
    await add_compute(db_pool, "compute-2")

    deleted = await client.delete(f"/v2.1/os-services/{service.uuid}", headers=at("2.53"))

    assert deleted.status_code == 204, deleted.text
    listed = (await client.get("/v2.1/os-services", headers=at("2.53"))).json()["services"]
    assert [s["host"] for s in listed] == ["compute-2"]
    hypervisors = (await client.get("/v2.1/os-hypervisors", headers=at("2.53"))).json()
    assert str(node.uuid) not in {h["id"] for h in hypervisors["hypervisors"]}
    async with db_pool.acquire() as conn:
        gone = await conn.fetchrow(
            "SELECT deleted_at IS NOT NULL AS deleted FROM compute_nodes WHERE id = $1", node.id
        )
    assert gone is not None
    assert gone["deleted"]
    again = await client.delete(f"/v2.1/os-services/{service.uuid}", headers=at("2.53"))
    assert again.status_code == 404


async def test_refusals_are_409_with_the_reason_and_change_nothing(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    running, _ = await add_compute(db_pool, "running")
    hosting, node = await add_compute(db_pool, "hosting", up=False)
    await add_image(db_pool)
    await place_on(db_pool, await create(client), node)
    before = await _rows(db_pool)

    up = await client.delete(f"/v2.1/os-services/{running.uuid}", headers=at("2.53"))
    busy = await client.delete(f"/v2.1/os-services/{hosting.uuid}", headers=at("2.53"))

    assert up.status_code == 409
    assert "is up, its last heartbeat was" in up.json()["conflictingRequest"]["message"]
    assert busy.status_code == 409
    assert "hosting instances" in busy.json()["conflictingRequest"]["message"]
    assert "has 1 server(s)" in busy.json()["conflictingRequest"]["message"]
    assert await _rows(db_pool) == before


async def test_ids_below_2_53_bad_ids_and_members(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    service, _ = await add_compute(db_pool, "compute-1", up=False)

    member = await client.delete(f"/v2.1/os-services/{service.id}", headers=MEMBER)
    bad_uuid = await client.delete("/v2.1/os-services/42", headers=at("2.53"))
    bad_id = await client.delete(f"/v2.1/os-services/{service.uuid}", headers=ADMIN)
    superscript = await client.delete("/v2.1/os-services/%C2%B2", headers=ADMIN)
    unknown = await client.delete("/v2.1/os-services/999999", headers=ADMIN)
    by_id = await client.delete(f"/v2.1/os-services/{service.id}", headers=ADMIN)

    assert member.status_code == 403
    assert (bad_uuid.status_code, bad_id.status_code, superscript.status_code) == (400, 400, 400)
    assert unknown.status_code == 404
    assert by_id.status_code == 204
