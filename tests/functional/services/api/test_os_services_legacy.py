"""os-services changes at microversions 2.1 to 2.52: the action in the path."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.functional.services.api.conftest import ADMIN, MEMBER, add_compute, at

pytestmark = pytest.mark.functional

COMPUTE = {"host": "compute-1", "binary": "keel-compute"}


async def state(client: httpx.AsyncClient) -> dict[str, object]:
    listed = await client.get("/v2.1/os-services", headers=at("2.52"), params={"host": "compute-1"})
    [service] = listed.json()["services"]
    return service  # type: ignore[no-any-return]


async def test_disable_with_a_reason_enable_and_force_down(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "compute-1")

    disabled = await client.put(
        "/v2.1/os-services/disable-log-reason",
        headers=at("2.52"),
        json={**COMPUTE, "disabled_reason": "maintenance"},
    )
    assert disabled.status_code == 200, disabled.text
    assert disabled.json() == {
        "service": {**COMPUTE, "status": "disabled", "disabled_reason": "maintenance"}
    }
    # The list adds what an operator reads of the host's fence (service list --long).
    assert (await state(client))["disabled_reason"] == "maintenance; no armed fence"

    enabled = await client.put("/v2.1/os-services/enable", headers=ADMIN, json=COMPUTE)
    assert enabled.json() == {"service": {**COMPUTE, "status": "enabled"}}
    assert (await state(client))["status"] == "enabled"

    plain = await client.put("/v2.1/os-services/disable", headers=ADMIN, json=COMPUTE)
    assert plain.json() == {"service": {**COMPUTE, "status": "disabled"}}
    assert (await state(client))["status"] == "disabled"

    down = await client.put(
        "/v2.1/os-services/force-down", headers=at("2.11"), json={**COMPUTE, "forced_down": True}
    )
    assert down.json() == {"service": {**COMPUTE, "forced_down": True}}
    assert (await state(client))["forced_down"] is True


async def test_legacy_update_rules(client: httpx.AsyncClient, db_pool: asyncpg.Pool) -> None:
    await add_compute(db_pool, "compute-1")
    put = client.put
    assert (await put("/v2.1/os-services/force-down", headers=at("2.10"),
                      json={**COMPUTE, "forced_down": True})).status_code == 404  # fmt: skip
    assert (await put("/v2.1/os-services/reboot", headers=ADMIN, json=COMPUTE)).status_code == 404
    missing_reason = await put("/v2.1/os-services/disable-log-reason", headers=ADMIN, json=COMPUTE)
    assert missing_reason.json()["badRequest"]["message"] == "Missing disabled reason field"
    no_flag = await put("/v2.1/os-services/force-down", headers=at("2.11"), json=COMPUTE)
    assert no_flag.json()["badRequest"]["message"] == "Missing forced_down field"
    for body in ({"host": "compute-1"}, {**COMPUTE, "extra": 1}, {**COMPUTE, "host": "a b"}):
        assert (await put("/v2.1/os-services/enable", headers=ADMIN, json=body)).status_code == 400
    conductor = {"host": "compute-1", "binary": "keel-conductor"}
    refused = await put("/v2.1/os-services/enable", headers=ADMIN, json=conductor)
    assert refused.status_code == 400
    unknown = await put(
        "/v2.1/os-services/enable", headers=ADMIN, json={**COMPUTE, "host": "nohost"}
    )
    assert unknown.status_code == 404
    assert (await put("/v2.1/os-services/enable", headers=MEMBER, json=COMPUTE)).status_code == 403


async def test_nova_compute_names_the_keel_compute_service(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "compute-1")
    nova = {"host": "compute-1", "binary": "nova-compute"}
    disabled = await client.put("/v2.1/os-services/disable", headers=ADMIN, json=nova)
    assert disabled.status_code == 200, disabled.text
    assert disabled.json() == {"service": {**COMPUTE, "status": "disabled"}}
    assert (await state(client))["status"] == "disabled"
