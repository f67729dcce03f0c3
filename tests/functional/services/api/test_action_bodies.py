"""Action bodies as Nova takes them: ``os-stop`` and ``os-start`` take any value."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.db import instances
from shared.objects.states import TaskState, VmState
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


@pytest.mark.parametrize("value", [None, {}, {"anything": 1}, "now", [1]])
async def test_stop_and_start_take_any_value(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    conductor: Recorder,
    agents: StandInAgents,
    value: Any,
) -> None:
    await add_image(db_pool)
    service, node = await add_compute(db_pool, "host-a")
    await agents.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=ADMIN, json=server_body())
    server_id = created.json()["server"]["id"]
    await place_on(db_pool, server_id, node)
    async with db_pool.acquire() as conn:
        await instances.set_active(conn, UUID(server_id))

    stopped = await client.post(
        f"/v2.1/servers/{server_id}/action", headers=ADMIN, json={"os-stop": value}
    )
    assert stopped.status_code == 202, stopped.text
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, UUID(server_id))
        assert shown.task_state == TaskState.POWERING_OFF
        await conn.execute(
            "UPDATE instances SET vm_state = $2, task_state = NULL WHERE uuid = $1",
            UUID(server_id),
            VmState.STOPPED.value,
        )
    started = await client.post(
        f"/v2.1/servers/{server_id}/action", headers=ADMIN, json={"os-start": value}
    )
    assert started.status_code == 202, started.text
