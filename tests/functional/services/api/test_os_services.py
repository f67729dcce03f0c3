"""os-services through the API."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from shared.db import services
from shared.versions import SERVICE_VERSION
from tests.functional.services.api.conftest import ADMIN, add_compute, at

pytestmark = pytest.mark.functional


async def _conductor_service(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        service = await services.get_or_create(
            conn,
            host="control",
            binary="keel-conductor",
            topic="conductor",
            version=1,
            down_time=60,
        )
        await services.heartbeat(conn, service.uuid, 1)


async def test_list_at_2_1_and_2_53(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    await _conductor_service(db_pool)
    compute, _ = await add_compute(db_pool, "compute-1", zone="az1")
    await add_compute(db_pool, "compute-2", up=False)

    old = (await client.get("/v2.1/os-services", headers=ADMIN)).json()["services"]
    assert all(isinstance(s["id"], int) for s in old)
    assert "forced_down" not in old[0]
    new = (await client.get("/v2.1/os-services", headers=at("2.69"))).json()["services"]
    by_host = {s["host"]: s for s in new}
    assert by_host["compute-1"]["id"] == str(compute.uuid)
    assert by_host["compute-1"]["zone"] == "az1"
    assert by_host["compute-1"]["state"] == "up"
    assert by_host["compute-2"]["state"] == "down"
    assert by_host["control"]["zone"] == "internal"
    assert by_host["control"]["binary"] == "keel-conductor"
    assert by_host["compute-1"]["forced_down"] is False


async def test_host_and_binary_filters(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    await _conductor_service(db_pool)
    await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "compute-2")
    params = {"host": "compute-2", "binary": "keel-compute"}
    found = (await client.get("/v2.1/os-services", headers=ADMIN, params=params)).json()
    assert [s["host"] for s in found["services"]] == ["compute-2"]
    computes = await client.get(
        "/v2.1/os-services", headers=ADMIN, params={"binary": "keel-compute"}
    )
    assert len(computes.json()["services"]) == 2


async def test_disable_enable_and_force_down_at_2_53(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    compute, _ = await add_compute(db_pool, "compute-1")
    path = f"/v2.1/os-services/{compute.uuid}"

    disabled = await client.put(
        path, headers=at("2.53"), json={"status": "disabled", "disabled_reason": "maintenance"}
    )
    assert disabled.status_code == 200, disabled.text
    assert disabled.json()["service"]["status"] == "disabled"
    assert disabled.json()["service"]["disabled_reason"] == "maintenance"

    enabled = await client.put(path, headers=at("2.53"), json={"status": "enabled"})
    assert enabled.json()["service"]["status"] == "enabled"
    assert enabled.json()["service"]["disabled_reason"] is None

    down = await client.put(path, headers=at("2.53"), json={"forced_down": True})
    assert down.json()["service"]["forced_down"] is True
    assert down.json()["service"]["state"] == "down"
    up = await client.put(path, headers=at("2.53"), json={"forced_down": False})
    assert up.json()["service"]["state"] == "up"


async def test_update_rules(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    compute, _ = await add_compute(db_pool, "compute-1")
    path = f"/v2.1/os-services/{compute.uuid}"
    old = await client.put(path, headers=at("2.52"), json={"status": "disabled"})
    assert old.status_code == 404
    for body in (
        {},
        {"status": "paused"},
        {"status": "enabled", "disabled_reason": "why"},
        {"forced_down": "perhaps"},
    ):
        response = await client.put(path, headers=at("2.53"), json=body)
        assert response.status_code == 400, body
    assert (
        await client.put("/v2.1/os-services/x", headers=at("2.53"), json={"status": "enabled"})
    ).status_code == 400
    missing = "/v2.1/os-services/00000000-0000-0000-0000-000000000000"
    assert (
        await client.put(missing, headers=at("2.53"), json={"status": "enabled"})
    ).status_code == 404


async def test_only_compute_services_are_updated(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await _conductor_service(db_pool)
    listed = (await client.get("/v2.1/os-services", headers=at("2.53"))).json()["services"]
    path = f"/v2.1/os-services/{listed[0]['id']}"
    response = await client.put(path, headers=at("2.53"), json={"status": "disabled"})
    assert response.status_code == 400
    assert "keel-compute" in response.json()["badRequest"]["message"]


async def test_nova_binary_names_find_keel_services(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await _conductor_service(db_pool)
    await add_compute(db_pool, "compute-1")
    await add_compute(db_pool, "compute-2")
    for version in ("2.1", "2.53"):
        computes = await client.get(
            "/v2.1/os-services", headers=at(version), params={"binary": "nova-compute"}
        )
        found = computes.json()["services"]
        assert sorted(s["host"] for s in found) == ["compute-1", "compute-2"]
        assert {s["binary"] for s in found} == {"nova-compute"}
        conductors = await client.get(
            "/v2.1/os-services", headers=at(version), params={"binary": "nova-conductor"}
        )
        assert [s["host"] for s in conductors.json()["services"]] == ["control"]


async def test_the_list_says_whether_each_compute_hosts_fence_is_armed(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    """``openstack compute service list --long`` shows it in its Disabled Reason column."""
    await add_compute(db_pool, "armed-1")
    await add_compute(db_pool, "unarmed-1")
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET fence_lease = 90, version = $1
                WHERE host = 'armed-1' AND "binary" = 'keel-compute'""",
            SERVICE_VERSION,
        )

    listed = await client.get("/v2.1/os-services", headers=at("2.53"))

    reasons = {s["host"]: s["disabled_reason"] for s in listed.json()["services"]}
    assert reasons["armed-1"] == "fence armed, lease 90s"
    assert reasons["unarmed-1"] == "no armed fence"
