"""``evacuate`` only of a fenced host: silent past its armed fence's lease, or forced down.

keel-api in-process against real PostgreSQL and RabbitMQ; the compute services' rows are
set as their agents would have left them (release, fence lease, last heartbeat).
"""

from __future__ import annotations

import asyncio
import re
from typing import cast
from uuid import UUID

import asyncpg
import httpx
import pytest

from shared.config import FencingSettings, Settings
from shared.context import RequestContext
from shared.db import compute_nodes, instances, move_requests, moves, services
from shared.exceptions import MessagingTimeout
from shared.objects.migration import EVACUATION, MigrationStatus
from shared.objects.states import TaskState
from shared.versions import HOST_FENCE_VERSION, SERVICE_VERSION
from tests.functional.services.api.conftest import (
    ADMIN,
    Recorder,
    add_compute,
    add_image,
    at,
    place_on,
)
from tests.functional.services.api.test_publish_outcomes import GoesDown
from tests.functional.services.api.test_servers import server_body

pytestmark = pytest.mark.functional

DOWN, FENCE, MARGIN = 4.0, 8.0, 2.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"service_down_time": DOWN, "fencing": FencingSettings(margin=MARGIN)}
    )


async def agent_left(
    pool: asyncpg.Pool,
    host: str,
    *,
    silent: float,
    fence: float | None = FENCE,
    version: int = SERVICE_VERSION,
) -> None:
    """``host``'s agent's last heartbeat, ``silent`` seconds ago: its release, and the lease
    of the host's fence it reported (``None``: no armed fence)."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET version = $2, self_fence_after = $3, fence_lease = $3,
                      last_seen_up = now() - make_interval(secs => $4)
                WHERE host = $1 AND "binary" = 'keel-compute'""",
            host,
            version,
            fence,
            silent,
        )


async def active_on(client: httpx.AsyncClient, pool: asyncpg.Pool, host: str, name: str) -> str:
    _, node = await add_compute(pool, host)
    response = await client.post("/v2.1/servers", headers=ADMIN, json=server_body(name=name))
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    await place_on(pool, server_id, node)
    async with pool.acquire() as conn:
        await instances.set_active(conn, UUID(server_id))
    return server_id


async def evacuate(client: httpx.AsyncClient, server_id: str) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server_id}/action", headers=at("2.29"), json={"evacuate": {}}
    )


async def moves_of(pool: asyncpg.Pool, server_id: str) -> int:
    async with pool.acquire() as conn:
        found: int = await conn.fetchval(
            "SELECT count(*) FROM migrations WHERE instance_uuid = $1", UUID(server_id)
        )
    return found


@pytest.fixture
async def world(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> dict[str, str]:
    await add_image(db_pool)
    servers = {
        host: await active_on(client, db_pool, host, f"on-{host}")
        for host in ("cut", "no-fence", "old", "spare")
    }
    for host in servers:
        await agent_left(db_pool, host, silent=0)
    return servers


async def test_a_host_silent_less_than_its_lease_is_refused_naming_the_seconds_left(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, world: dict[str, str]
) -> None:
    server = world["cut"]
    up = await evacuate(client, server)
    assert up.status_code == 400
    assert up.json()["badRequest"]["message"] == "Compute service of cut is still in use."

    await agent_left(db_pool, "cut", silent=DOWN + 1)
    early = await evacuate(client, server)
    assert early.status_code == 400
    message = early.json()["badRequest"]["message"]
    found = re.search(r"may be evacuated (\d+)s from now", message)
    assert found is not None, message
    assert 1 <= int(found[1]) <= FENCE + MARGIN
    assert await moves_of(db_pool, server) == 0

    await agent_left(db_pool, "cut", silent=FENCE + MARGIN + 1)
    assert (await evacuate(client, server)).status_code == 200
    assert await moves_of(db_pool, server) == 1


NOT_FENCING = {
    "no-fence": (None, SERVICE_VERSION, "no armed host fence"),
    "old": (FENCE, HOST_FENCE_VERSION - 1, "keeps no host fence"),
}


@pytest.mark.parametrize("host", sorted(NOT_FENCING))
async def test_a_host_without_an_armed_fence_needs_forcing_down(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, world: dict[str, str], host: str
) -> None:
    """Fencing off or a dead fence, or an agent before fences: an agent that died leaves
    its guests running for ever, so time alone never makes its host evacuable."""
    fence, version, says = NOT_FENCING[host]
    server = world[host]
    await agent_left(db_pool, host, silent=3600, fence=fence, version=version)

    refused = await evacuate(client, server)
    assert refused.status_code == 400
    assert says in refused.json()["badRequest"]["message"]
    assert await moves_of(db_pool, server) == 0

    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET forced_down = true
                WHERE host = $1 AND "binary" = 'keel-compute'""",
            host,
        )
    assert (await evacuate(client, server)).status_code == 200
    assert await moves_of(db_pool, server) == 1


async def test_a_host_forced_down_with_an_armed_fence_is_evacuated_at_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, world: dict[str, str]
) -> None:
    """Accepted and recorded at once; the conductor starts the new copy only once the
    fence's lease has run out (tests/functional/services/conductor/test_held_evacuations.py)."""
    server = world["cut"]
    await agent_left(db_pool, "cut", silent=1.0)
    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET forced_down = true
                WHERE host = 'cut' AND "binary" = 'keel-compute'"""
        )

    assert (await evacuate(client, server)).status_code == 200
    assert await moves_of(db_pool, server) == 1


async def test_two_evacuations_of_one_server_at_once_record_one_move(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, world: dict[str, str]
) -> None:
    server = world["cut"]
    await agent_left(db_pool, "cut", silent=FENCE + MARGIN + 1)

    answers = await asyncio.gather(evacuate(client, server), evacuate(client, server))

    assert sorted(a.status_code for a in answers) == [200, 409]
    assert await moves_of(db_pool, server) == 1


async def test_a_move_whose_cast_fails_is_withdrawn_unless_a_conductor_took_it(
    db_pool: asyncpg.Pool, world: dict[str, str]
) -> None:
    """The recording path keel-api and the conductors' automatic evacuation share. A move
    the database is out to withdraw stands too: its cast may have gone out."""
    ctx = RequestContext.internal()
    async with db_pool.acquire() as conn:
        source = await compute_nodes.get_by_id(
            conn, await conn.fetchval("SELECT id FROM compute_nodes WHERE host = 'cut'")
        )

    async def lost(_ctx: RequestContext, _migration: UUID) -> None:
        raise MessagingTimeout("the broker did not confirm the message")

    server = UUID(world["cut"])

    outage = GoesDown(db_pool)

    async def lost_and_outage(_ctx: RequestContext, _migration: UUID) -> None:
        outage.down = True
        raise MessagingTimeout("the broker did not confirm the message")

    async def attempt(
        taken: bool, down: bool = False
    ) -> tuple[move_requests.Outcome, str, str | None]:
        migration = await move_requests.record(
            db_pool, ctx, EVACUATION, instance_uuid=server, source=source
        )
        assert migration is not None
        if taken:  # a conductor claimed a destination before the answer was lost
            async with db_pool.acquire() as conn:
                await moves.swap_status(
                    conn,
                    migration.uuid,
                    expected=[MigrationStatus.ACCEPTED],
                    new=MigrationStatus.PRE_MIGRATING,
                )
        send = lost_and_outage if down else lost
        pool = cast(asyncpg.Pool, outage)
        outcome, _ = await move_requests.cast_or_withdraw(pool, ctx, EVACUATION, migration, send)
        outage.down = False
        async with db_pool.acquire() as conn:
            record = await moves.get(conn, migration.uuid)
            instance = await instances.get(conn, server)
        return outcome, record.status, instance.task_state

    # Withdrawn, nothing is left: the server may be moved again at once.
    assert await attempt(taken=False) == (
        move_requests.Outcome.WITHDRAWN,
        MigrationStatus.ERROR,
        None,
    )
    async with db_pool.acquire() as conn:
        action = await conn.fetchrow(
            """SELECT withdrawn_at IS NOT NULL AS withdrawn, result FROM instance_actions
                WHERE instance_uuid = $1 AND request_id = $2""",
            server,
            ctx.request_id,
        )
    assert action is not None
    assert (action["withdrawn"], action["result"]) == (True, "Error")
    assert await attempt(taken=False, down=True) == (
        move_requests.Outcome.TAKEN,
        MigrationStatus.ACCEPTED,
        EVACUATION.choosing,
    )
    async with db_pool.acquire() as conn:  # the move deadline ended it
        await conn.execute(
            "UPDATE migrations SET status = 'error' WHERE instance_uuid = $1", server
        )
        await instances.finish_task(conn, server, (EVACUATION.choosing,))
    assert await attempt(taken=True) == (
        move_requests.Outcome.TAKEN,
        MigrationStatus.PRE_MIGRATING,
        TaskState.REBUILDING,
    )


async def end_stopped_of(pool: asyncpg.Pool, server_id: str) -> list[bool]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT end_stopped FROM migrations WHERE instance_uuid = $1", UUID(server_id)
        )
    return [row["end_stopped"] for row in rows]


@pytest.mark.parametrize(("version", "stopped"), [("2.94", False), ("2.95", True)])
async def test_from_2_95_an_evacuation_is_recorded_to_end_stopped(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    world: dict[str, str],
    *,
    version: str,
    stopped: bool,
) -> None:
    """The conductor then builds the new copy powered off and ends the server SHUTOFF
    (tests/functional/services/conductor/test_evacuate_stopped.py)."""
    server = world["cut"]
    await agent_left(db_pool, "cut", silent=FENCE + MARGIN + 1)
    answer = await client.post(
        f"/v2.1/servers/{server}/action", headers=at(version), json={"evacuate": {}}
    )
    assert answer.status_code == 200, answer.text
    assert await end_stopped_of(db_pool, server) == [stopped]


async def test_a_2_95_evacuation_waits_for_every_conductor_to_stop_servers(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, world: dict[str, str]
) -> None:
    """An older conductor would start the evacuated server: 2.95 is refused meanwhile, as
    Nova refuses it until every compute is new enough; 2.94 is not."""
    server = world["cut"]
    await agent_left(db_pool, "cut", silent=FENCE + MARGIN + 1)
    async with db_pool.acquire() as conn:
        old = await services.get_or_create(
            conn,
            host="conductor-1",
            binary="keel-conductor",
            topic="conductor",
            version=22,
            down_time=60,
        )
        await services.heartbeat(conn, old.uuid, 22)
    refused = await client.post(
        f"/v2.1/servers/{server}/action", headers=at("2.95"), json={"evacuate": {}}
    )
    assert refused.status_code == 400
    message = refused.json()["badRequest"]["message"]
    assert "conductor-1 (release uphaul)" in message
    assert await moves_of(db_pool, server) == 0
    assert (await evacuate(client, server)).status_code == 200
