"""``os-migrateLive`` and a server's live migrations through keel-api, per microversion:
what is refused (nothing recorded), what is recorded, force-complete and abort."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.servers import publish
from services.compute.rpcapi import ComputeAPI
from services.conductor.live_rpc import LiveConductorAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import instances
from shared.exceptions import MessagingTimeout
from shared.rpc.amqp import AmqpTransport
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

OLD_BODY = {"host": None, "block_migration": False, "disk_over_commit": False}
NEW_BODY = {"host": None, "block_migration": "auto"}


@pytest.fixture
async def server(client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder) -> str:
    """The member's ACTIVE server on host-a (its agent up), host-b beside it."""
    await add_image(db_pool)
    _, node = await add_compute(db_pool, "host-a")
    await add_compute(db_pool, "host-b")
    server_id = await create(client)
    await place_on(db_pool, server_id, node)
    async with db_pool.acquire() as conn:
        await instances.set_active(conn, UUID(server_id))
    return server_id


async def live(
    client: httpx.AsyncClient,
    server: str,
    value: Any,
    version: str = "2.1",
    headers: dict[str, str] = ADMIN,
) -> httpx.Response:
    return await client.post(
        f"/v2.1/servers/{server}/action",
        headers=at(version, headers),
        json={"os-migrateLive": value},
    )


async def records(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await conn.fetch("SELECT * FROM migrations ORDER BY id")


@pytest.mark.parametrize(
    ("version", "value", "forced"),
    [
        ("2.1", OLD_BODY, False),
        ("2.1", {**OLD_BODY, "block_migration": "true", "disk_over_commit": "0"}, False),
        ("2.24", {**OLD_BODY, "host": "host-b"}, False),
        ("2.25", NEW_BODY, False),
        ("2.25", {"host": "host-b", "block_migration": True}, False),
        ("2.30", {"host": "host-b", "block_migration": "auto", "force": True}, True),
        ("2.30", {"host": None, "block_migration": "auto", "force": True}, False),
        ("2.68", {"host": "host-b", "block_migration": False}, False),
    ],
)
async def test_a_live_migration_is_recorded_and_accepted(
    client: httpx.AsyncClient,
    *,
    db_pool: asyncpg.Pool,
    server: str,
    version: str,
    value: dict[str, Any],
    forced: bool,
) -> None:
    response = await live(client, server, value, version)

    assert response.status_code == 202, response.text
    assert response.content == b""
    [record] = await records(db_pool)
    assert (record["migration_type"], record["status"], record["source_compute"]) == (
        "live-migration",
        "accepted",
        "host-a",
    )
    assert record["dest_host"] == value["host"]
    assert record["forced"] is forced
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, UUID(server))
    assert (shown.vm_state, shown.task_state) == ("active", "migrating")


@pytest.mark.parametrize(
    ("version", "value", "status", "message"),
    [
        ("2.1", {"host": None, "block_migration": False}, 400, "'disk_over_commit' is a required"),
        ("2.1", {"host": None, "disk_over_commit": False}, 400, "'block_migration' is a required"),
        ("2.1", {**OLD_BODY, "block_migration": "auto"}, 400, "not a valid boolean"),
        ("2.25", {"block_migration": "auto"}, 400, "'host' is a required"),
        ("2.25", {**NEW_BODY, "disk_over_commit": False}, 400, "additional properties"),
        ("2.25", {**NEW_BODY, "block_migration": "sometimes"}, 400, "'auto'"),
        ("2.29", {**NEW_BODY, "force": True}, 400, "additional properties"),
        ("2.68", {**NEW_BODY, "force": False}, 400, "additional properties"),
        ("2.30", {**NEW_BODY, "force": "perhaps"}, 400, "not a valid boolean"),
        ("2.25", {**NEW_BODY, "host": 5}, 400, "host"),
        ("2.25", {**NEW_BODY, "host": "bad host!"}, 400, "host"),
        ("2.25", "host-b", 400, "must be an object"),
        ("2.25", {**NEW_BODY, "host": "host-z"}, 400, "Compute host host-z could not be found."),
        ("2.25", {**NEW_BODY, "host": "host-a"}, 400, "to current host (host-a)"),
    ],
)
async def test_bad_live_migrations_are_refused_and_record_nothing(
    client: httpx.AsyncClient,
    *,
    db_pool: asyncpg.Pool,
    server: str,
    version: str,
    value: Any,
    status: int,
    message: str,
) -> None:
    response = await live(client, server, value, version)

    assert response.status_code == status, response.text
    assert message in response.text
    assert await records(db_pool) == []
    async with db_pool.acquire() as conn:
        shown = await instances.get(conn, UUID(server))
    assert shown.task_state is None


async def test_members_stopped_servers_and_tasks_are_refused(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    member = await live(client, server, NEW_BODY, "2.25", MEMBER)
    assert member.status_code == 403, member.text

    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'stopped' WHERE uuid = $1", UUID(server)
        )
    stopped = await live(client, server, NEW_BODY, "2.25")
    assert stopped.status_code == 409, stopped.text
    assert "vm_state stopped" in stopped.text

    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = 'active', task_state = 'rebooting' WHERE uuid = $1",
            UUID(server),
        )
    busy = await live(client, server, NEW_BODY, "2.25")
    assert busy.status_code == 409, busy.text
    assert await records(db_pool) == []


async def test_a_paused_server_may_be_live_migrated_twice_at_once_recording_one(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET vm_state = 'paused' WHERE uuid = $1", UUID(server))
    first, second = await asyncio.gather(
        live(client, server, NEW_BODY, "2.25"), live(client, server, NEW_BODY, "2.25")
    )

    assert sorted([first.status_code, second.status_code]) == [202, 409]
    assert len(await records(db_pool)) == 1


async def migrations_of(
    client: httpx.AsyncClient, server: str, version: str = "2.23"
) -> httpx.Response:
    return await client.get(f"/v2.1/servers/{server}/migrations", headers=at(version))


async def test_a_servers_live_migrations_their_progress_force_complete_and_abort(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    assert (await live(client, server, NEW_BODY, "2.25")).status_code == 202
    [record] = await records(db_pool)
    number = record["id"]
    base = f"/v2.1/servers/{server}/migrations/{number}"

    assert (await migrations_of(client, server, "2.22")).status_code == 404
    listed = await migrations_of(client, server, "2.80")
    assert listed.status_code == 200, listed.text
    [shown] = listed.json()["migrations"]
    assert (shown["id"], shown["status"], shown["server_uuid"]) == (number, "accepted", server)
    assert shown["uuid"] == str(record["uuid"])
    assert shown["memory_total_bytes"] is None
    assert {"user_id", "project_id", "disk_remaining_bytes"} <= set(shown)

    early = await client.post(f"{base}/action", headers=at("2.22"), json={"force_complete": None})
    assert early.status_code == 400, early.text
    assert "Cannot force_complete" in early.text
    aborted_early = await client.delete(base, headers=at("2.24"))
    assert aborted_early.status_code == 400, aborted_early.text

    async with db_pool.acquire() as conn:
        await conn.execute(
            """UPDATE migrations SET status = 'running', memory_total_bytes = 100,
                      memory_processed_bytes = 40, memory_remaining_bytes = 60
                WHERE id = $1""",
            number,
        )
    one = await client.get(base, headers=at("2.23"))
    assert one.status_code == 200, one.text
    assert (
        one.json()["migration"]["memory_processed_bytes"],
        "uuid" in one.json()["migration"],
    ) == (
        40,
        False,
    )
    assert (
        await client.post(f"{base}/action", headers=at("2.21"), json={"force_complete": None})
    ).status_code == 404
    forced = await client.post(f"{base}/action", headers=at("2.22"), json={"force_complete": None})
    assert forced.status_code == 202, forced.text
    assert (
        await client.get(f"/v2.1/servers/{server}/migrations/999", headers=at("2.23"))
    ).status_code == 404
    assert (await client.delete(base, headers=at("2.23"))).status_code == 404

    aborted = await client.delete(base, headers=at("2.24"))
    assert aborted.status_code == 202, aborted.text
    [ended] = await records(db_pool)
    assert (ended["status"], ended["force_complete"]) == ("cancelled", True)
    async with db_pool.acquire() as conn:
        shown_server = await instances.get(conn, UUID(server))
    assert (shown_server.vm_state, shown_server.task_state, shown_server.host) == (
        "active",
        None,
        "host-a",
    )
    assert (await migrations_of(client, server)).json() == {"migrations": []}
    assert (await client.get(base, headers=at("2.23"))).status_code == 404
    again = await client.delete(base, headers=at("2.24"))
    assert again.status_code == 400

    listing = await client.get("/v2.1/os-migrations", headers=at("2.23"))
    assert [m["migration_type"] for m in listing.json()["migrations"]] == ["live-migration"]


async def test_from_2_65_an_accepted_live_migration_may_be_aborted(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    assert (await live(client, server, NEW_BODY, "2.25")).status_code == 202
    [record] = await records(db_pool)

    aborted = await client.delete(
        f"/v2.1/servers/{server}/migrations/{record['id']}", headers=at("2.65")
    )

    assert aborted.status_code == 202, aborted.text
    [ended] = await records(db_pool)
    assert ended["status"] == "cancelled"


class LosingLive(LiveConductorAPI):
    async def live_migrate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        raise MessagingTimeout("the connection closed before the broker confirmed it")


@pytest.fixture
async def losing(
    settings: Settings, db_pool: asyncpg.Pool, transport: AmqpTransport
) -> AsyncIterator[httpx.AsyncClient]:
    conductor = ConductorAPI(transport)
    conductor.live = LosingLive(conductor.client)
    app = create_app(settings, db_pool, conductor, ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http


async def test_a_live_migration_that_cannot_be_cast_is_503_and_changes_nothing(
    losing: httpx.AsyncClient,
    client: httpx.AsyncClient,
    *,
    db_pool: asyncpg.Pool,
    server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(publish, "PAUSE", 0.01)
    async with db_pool.acquire() as conn:
        before = await instances.get(conn, UUID(server))

    answer = await live(losing, server, NEW_BODY, "2.25")

    assert answer.status_code == 503, answer.text
    async with db_pool.acquire() as conn:
        after = await instances.get(conn, UUID(server))
    assert (after.vm_state, after.task_state, after.host) == (
        before.vm_state,
        None,
        before.host,
    )
    assert [r["status"] for r in await records(db_pool)] == ["error"]
    assert (await migrations_of(client, server)).json() == {"migrations": []}
