"""A server in ERROR whose build failed holds no claim: nothing of it is powered.

A build delivered twice may fail once and run once; the failure, arriving first, puts
the server in ERROR and releases its claim, and the run's result, on its way, makes it
ACTIVE and claims again. Until then a stop or a hard reboot would power a guest on
resources nobody accounts for, and end the server in a state that result no longer
changes (finding 48): keel-api refuses both (409) while the server holds no claim.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import allocations, instances
from shared.objects.states import VmState
from tests.functional.services.api.conftest import (
    ADMIN,
    Recorder,
    StandInAgents,
    add_compute,
    add_image,
    place_on,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

ACTIONS = [{"os-stop": None}, {"reboot": {"type": "HARD"}}]


async def _failed_build(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents, host: str
) -> tuple[UUID, int]:
    """A server placed on ``host`` whose build failed: ERROR, no claim."""
    await add_image(db_pool)
    service, node = await add_compute(db_pool, host)
    await agents.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())
    assert created.status_code == 202, created.text
    server = UUID(created.json()["server"]["id"])
    await place_on(db_pool, str(server), node)
    async with db_pool.acquire() as conn:
        failed = await instances.set_build_failed(conn, server, message="spawn failed")
    assert failed is not None
    assert failed.vm_state == VmState.ERROR
    return server, node.id


@pytest.mark.parametrize("body", ACTIONS, ids=["stop", "hard-reboot"])
async def test_a_server_whose_build_failed_is_not_powered(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    agents: StandInAgents,
    body: dict[str, object],
) -> None:
    server, _ = await _failed_build(client, db_pool, agents, f"unclaimed-{next(iter(body))}")

    refused = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=body)

    assert refused.status_code == 409, refused.text
    assert "holds no claim" in refused.json()["conflictingRequest"]["message"]
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, server)
    assert (shown.vm_state, shown.task_state) == (VmState.ERROR, None)


@pytest.mark.parametrize("body", ACTIONS, ids=["stop", "hard-reboot"])
async def test_a_server_in_error_that_holds_its_claim_is_powered(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    agents: StandInAgents,
    body: dict[str, object],
) -> None:
    """Its guest ran once, or its late result claimed again: ERROR is no bar."""
    server, node_id = await _failed_build(client, db_pool, agents, f"claimed-{next(iter(body))}")
    async with db_pool.acquire() as conn:
        flavor = (await instances.get(conn, server)).flavor
        assert await allocations.claim(conn, node_id, server, flavor, force=True)

    accepted = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=body)

    assert accepted.status_code == 202, accepted.text
