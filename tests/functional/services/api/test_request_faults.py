"""A request whose database calls fail: 503 must mean that nothing happens.

keel-api on real PostgreSQL through a pool whose call number N fails once, before or
after the database acted; real RabbitMQ, the host's agent a stand-in that records what
reaches it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.config import Settings
from shared.db import allocations, instances
from tests.functional.faults import FailsOnce, every_call
from tests.functional.services.api.conftest import (
    ADMIN,
    IMAGE_ID,
    MEMBER,
    Faulty,
    Recorder,
    StandInAgents,
    add_compute,
    add_image,
    place_on,
)
from tests.functional.services.api.test_publish_outcomes import takes_requests
from tests.functional.services.api.test_servers import server_body
from tests.functional.services.conductor.stand_in import eventually

pytestmark = pytest.mark.functional


async def _server(
    client: httpx.AsyncClient, pool: asyncpg.Pool, agents: StandInAgents, host: str
) -> UUID:
    service, node = await add_compute(pool, host)
    await takes_requests(pool, host)
    await agents.serve(service.uuid)
    created = await client.post("/v2.1/servers", headers=MEMBER, json=server_body())
    assert created.status_code == 202, created.text
    server = UUID(created.json()["server"]["id"])
    await place_on(pool, str(server), node)
    async with pool.acquire() as conn:
        instance = await instances.set_active(conn, server, closing="create")
        assert instance is not None
        assert await allocations.claim(conn, node.id, server, instance.flavor)
    return server


async def _standing(pool: asyncpg.Pool, server: UUID, action: str) -> tuple[object, ...]:
    """The server's task and its requests of ``action`` no one withdrew or ended."""
    async with pool.acquire() as conn:
        instance = await instances.get(conn, server)
        standing = await conn.fetchval(
            """SELECT count(*) FROM instance_actions
                WHERE instance_uuid = $1 AND action = $2
                  AND withdrawn_at IS NULL AND finish_time IS NULL""",
            server,
            action,
        )
    return instance.task_state, standing


#: Each request: how it is sent, its action's name, its answer and task when it stands.
REQUESTS: dict[str, tuple[str, dict[str, Any] | None, str, int, str]] = {
    "delete": ("DELETE", None, "delete", 204, "deleting"),
    "os-stop": ("POST", {"os-stop": None}, "stop", 202, "powering-off"),
    "rebuild": (
        "POST",
        {"rebuild": {"imageRef": str(IMAGE_ID)}},
        "rebuild",
        202,
        "rebuild_spawning",
    ),
    "createImage": ("POST", {"createImage": {"name": "s"}}, "createImage", 202, "image_snapshot"),
    "migrate": ("POST", {"migrate": None}, "migrate", 202, "resize_prep"),
}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Image URLs signed, so that snapshots may be taken."""
    signing = settings.images.model_copy(update={"url_secret": "s" * 32})
    return settings.model_copy(update={"images": signing})


@pytest.mark.parametrize("request_name", list(REQUESTS))
@pytest.mark.parametrize("answered", [False, True], ids=["lost", "answer-lost"])
async def test_a_request_answered_503_leaves_nothing_to_be_sent_later(
    faulty: Faulty,
    client: httpx.AsyncClient,
    *,
    db_pool: asyncpg.Pool,
    agents: StandInAgents,
    conductor: Recorder,
    answered: bool,
    request_name: str,
) -> None:
    """Each database call of a DELETE (a stop, a rebuild, a snapshot, a migration) fails
    once, before or after the database acted. Answered 503, the request must not stand: a
    delete left marked and open would be sent again by the conductors (a promised delete,
    as a soft delete or a restore would be), and the server deleted after all. When the
    commit's answer was lost, keel-api withdraws what may have been recorded before it
    answers (in the background if the database cannot be reached then)."""
    method, body, action, done, task = REQUESTS[request_name]
    await add_image(db_pool)
    counter = iter(range(1000))

    async def scenario(at: int) -> FailsOnce:
        host = f"f503-{request_name}-{answered}-{next(counter)}"
        server = await _server(client, db_pool, agents, host)
        path = f"/v2.1/servers/{server}" + ("/action" if body else "")
        faulty.pool.arm(at, answered=answered)
        headers = ADMIN if request_name == "migrate" else MEMBER
        answer = await faulty.client.request(method, path, headers=headers, json=body)
        state = await _standing(db_pool, server, action)
        what = (" | ".join(faulty.pool.calls), faulty.pool.at, answer.status_code, state)
        if answer.status_code == 503:

            async def withdrawn() -> bool | None:
                return await _standing(db_pool, server, action) == (None, 0) or None

            assert await eventually(withdrawn), what
        else:
            assert answer.status_code == done, what
            assert state == (task, 1), what
        async with db_pool.acquire() as conn:  # out of the project's quota
            await conn.execute("UPDATE instances SET deleted_at = now() WHERE uuid = $1", server)
        return faulty.pool

    assert await every_call(scenario) > 1
