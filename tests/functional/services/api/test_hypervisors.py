"""os-hypervisors through the API."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from shared.db import services
from tests.functional.services.api.conftest import ADMIN, add_compute, at

pytestmark = pytest.mark.functional


async def test_list_at_2_1_uses_integer_ids(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    _, node = await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "compute-2", up=False)
    listed = (await client.get("/v2.1/os-hypervisors", headers=ADMIN)).json()["hypervisors"]
    assert listed[0] == {
        "id": node.id,
        "hypervisor_hostname": "compute-1",
        "state": "up",
        "status": "enabled",
    }
    assert listed[1]["state"] == "down"
    shown = await client.get(f"/v2.1/os-hypervisors/{node.id}", headers=ADMIN)
    assert shown.json()["hypervisor"]["vcpus"] == 8


async def test_detail_at_2_53_uses_uuids(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    service, node = await add_compute(db_pool, "compute-1")
    async with db_pool.acquire() as conn:
        await services.update_status(
            conn, service.uuid, 60, disabled=True, disabled_reason="maintenance"
        )
    detail = await client.get("/v2.1/os-hypervisors/detail", headers=at("2.53"))
    [hypervisor] = detail.json()["hypervisors"]
    assert hypervisor["id"] == str(node.uuid)
    assert hypervisor["status"] == "disabled"
    assert hypervisor["service"] == {
        "host": "compute-1",
        "id": str(service.uuid),
        "disabled_reason": "maintenance",
    }
    assert (hypervisor["memory_mb"], hypervisor["free_ram_mb"]) == (16384, 16384)
    assert hypervisor["cpu_info"] == {}
    shown = await client.get(f"/v2.1/os-hypervisors/{node.uuid}", headers=at("2.53"))
    assert shown.json()["hypervisor"]["hypervisor_hostname"] == "compute-1"


async def test_lookups_by_pattern_and_unknown_ids(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "storage-1")
    matched = await client.get(
        "/v2.1/os-hypervisors", headers=at("2.53"), params={"hypervisor_hostname_pattern": "stor"}
    )
    assert [h["hypervisor_hostname"] for h in matched.json()["hypervisors"]] == ["storage-1"]
    assert (
        await client.get("/v2.1/os-hypervisors/compute-1", headers=at("2.53"))
    ).status_code == 400
    assert (await client.get("/v2.1/os-hypervisors/compute-1", headers=ADMIN)).status_code == 404
    unknown = "/v2.1/os-hypervisors/00000000-0000-0000-0000-000000000000"
    assert (await client.get(unknown, headers=at("2.53"))).status_code == 404
