"""pause, unpause, suspend and resume through the API: compare-and-swaps, then a cast."""

from __future__ import annotations

from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import instances
from shared.objects.states import TaskState, VmState
from tests.functional.services.api.conftest import (
    ADMIN,
    MEMBER,
    Recorder,
    StandInAgents,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional


async def active_server(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, agents: StandInAgents
) -> str:
    await add_image(db_pool)
    service, node = await add_compute(db_pool, "host-a")
    await agents.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=MEMBER, json=server_body())
    server_id: str = created.json()["server"]["id"]
    await place_on(db_pool, server_id, node)
    async with db_pool.acquire() as conn:
        await instances.set_active(conn, UUID(server_id))
    return server_id


async def act(client: httpx.AsyncClient, server_id: str, action: str) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=MEMBER, json={action: None}
    )


async def settle(pool: asyncpg.Pool, server_id: str, vm_state: VmState) -> None:
    """What the conductor does when the agent reports success."""
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = $2, task_state = NULL WHERE uuid = $1",
            UUID(server_id),
            vm_state.value,
        )


async def state(pool: asyncpg.Pool, server_id: str) -> tuple[str, str | None]:
    async with pool.acquire() as conn:
        instance = await instances.get(conn, UUID(server_id))
    return instance.vm_state, instance.task_state


async def test_pause_unpause_suspend_resume_swap_the_task_and_show_the_status(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    agents: StandInAgents,
) -> None:
    server_id = await active_server(client, db_pool, agents)
    url = f"/v2.1/servers/{server_id}"

    assert (await act(client, server_id, "pause")).status_code == 202
    assert await state(db_pool, server_id) == ("active", TaskState.PAUSING.value)
    assert (await act(client, server_id, "pause")).status_code == 409
    await settle(db_pool, server_id, VmState.PAUSED)
    assert (await client.get(url, headers=MEMBER)).json()["server"]["status"] == "PAUSED"
    paused = await client.get("/v2.1/servers", headers=MEMBER, params={"status": "PAUSED"})
    assert [s["id"] for s in paused.json()["servers"]] == [server_id]
    assert (await act(client, server_id, "resume")).status_code == 409

    assert (await act(client, server_id, "unpause")).status_code == 202
    assert await state(db_pool, server_id) == ("paused", TaskState.UNPAUSING.value)
    await settle(db_pool, server_id, VmState.ACTIVE)

    assert (await act(client, server_id, "suspend")).status_code == 202
    assert await state(db_pool, server_id) == ("active", TaskState.SUSPENDING.value)
    await settle(db_pool, server_id, VmState.SUSPENDED)
    shown = (await client.get(url, headers=at("2.1", ADMIN))).json()["server"]
    assert shown["status"] == "SUSPENDED"
    assert (await act(client, server_id, "unpause")).status_code == 409
    assert (await act(client, server_id, "resume")).status_code == 202
    assert await state(db_pool, server_id) == ("suspended", TaskState.RESUMING.value)

    actions = await client.get(f"{url}/os-instance-actions", headers=MEMBER)
    names = [a["action"] for a in actions.json()["instanceActions"]]
    assert names[:4] == ["resume", "suspend", "unpause", "pause"]


async def test_a_stopped_server_cannot_be_paused_or_suspended(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    agents: StandInAgents,
) -> None:
    server_id = await active_server(client, db_pool, agents)
    await settle(db_pool, server_id, VmState.STOPPED)
    for action in ("pause", "suspend", "unpause", "resume"):
        refused = await act(client, server_id, action)
        assert refused.status_code == 409, action
        assert "vm_state stopped" in refused.json()["conflictingRequest"]["message"]
    assert await state(db_pool, server_id) == ("stopped", None)
