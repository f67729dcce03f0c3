"""``os-resetState`` (``openstack server set --state``) on real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.http.microversion import MAX_VERSION
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import DatabaseSettings, Settings
from shared.db.pool import create_pool
from shared.rpc.amqp import AmqpTransport
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image, at
from tests.functional.services.api.test_servers import create

pytestmark = pytest.mark.functional


def reset(state: object) -> dict[str, object]:
    return {"os-resetState": {"state": state}}


async def states(pool: asyncpg.Pool, server_id: str) -> tuple[str, str | None]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT vm_state, task_state FROM instances WHERE uuid = $1", UUID(server_id)
        )
    assert row is not None
    return row["vm_state"], row["task_state"]


async def stuck(pool: asyncpg.Pool, server_id: str, task: str = "powering-off") -> None:
    """The server, built once, as a task that never ended leaves it."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE instances SET vm_state = 'active', task_state = $2,
                                    launched_at = coalesce(launched_at, now())
                WHERE uuid = $1""",
            UUID(server_id),
            task,
        )


async def resets_recorded(pool: asyncpg.Pool, server_id: str) -> list[str]:
    """The result of each ``resetState`` action of the server (all by the admin, root)."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """SELECT result, user_id FROM instance_actions
                WHERE instance_uuid = $1 AND action = 'resetState' ORDER BY id""",
            UUID(server_id),
        )
    assert {row["user_id"] for row in rows} <= {"root"}
    return [row["result"] for row in rows]


@pytest.fixture
async def server(client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder) -> str:
    await add_image(db_pool)
    server_id = await create(client)
    await stuck(db_pool, server_id)
    return server_id


async def test_an_admin_resets_to_error_then_active_and_each_is_recorded(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    action = f"/v2.1/servers/{server}/action"

    to_error = await client.post(action, headers=at(str(MAX_VERSION)), json=reset("error"))
    assert to_error.status_code == 202, to_error.text
    assert to_error.content == b""
    shown = (await client.get(f"/v2.1/servers/{server}", headers=ADMIN)).json()["server"]
    assert (shown["status"], shown["OS-EXT-STS:task_state"]) == ("ERROR", None)

    await stuck(db_pool, server, "rebooting")
    to_active = await client.post(action, headers=at("2.1"), json=reset("active"))
    assert to_active.status_code == 202, to_active.text
    assert await states(db_pool, server) == ("active", None)

    listed = await client.get(f"/v2.1/servers/{server}/os-instance-actions", headers=ADMIN)
    assert [a["action"] for a in listed.json()["instanceActions"]][:2] == [
        "resetState",
        "resetState",
    ]
    assert await resets_recorded(db_pool, server) == ["Success", "Success"]


async def test_a_server_never_built_is_not_made_active_but_may_be_made_error(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    """No guest of a server whose build never succeeded exists: ACTIVE would be a lie."""
    await add_image(db_pool)
    server = await create(client)
    action = f"/v2.1/servers/{server}/action"

    refused = await client.post(action, headers=ADMIN, json=reset("active"))
    assert refused.status_code == 409, refused.text
    assert "never built" in refused.json()["conflictingRequest"]["message"]
    assert await states(db_pool, server) == ("building", "scheduling")
    assert await resets_recorded(db_pool, server) == []

    to_error = await client.post(action, headers=ADMIN, json=reset("error"))
    assert to_error.status_code == 202, to_error.text
    assert await states(db_pool, server) == ("error", None)
    again = await client.post(action, headers=ADMIN, json=reset("active"))
    assert again.status_code == 409, again.text
    assert await states(db_pool, server) == ("error", None)


@pytest.mark.parametrize(
    "case",
    [
        ("active", "deleting", "being deleted"),
        ("soft-delete", "deleting", "being deleted"),
        ("active", "soft-deleting", "being soft-deleted"),
        ("stopped", "soft-deleting", "being soft-deleted"),
        ("soft-delete", None, "soft-deleted"),
        ("soft-delete", "restoring", "soft-deleted"),
        ("shelved", "shelving_offloading", "shelved image"),
        ("shelved_offloaded", None, "shelved image"),
        ("shelved_offloaded", "spawning", "shelved image"),
    ],
)
@pytest.mark.parametrize("state", ["active", "error"])
async def test_a_server_being_deleted_or_whose_copy_is_its_shelved_image_is_not_reset(
    client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    server: str,
    case: tuple[str, str | None, str],
    state: str,
) -> None:
    """A delete answered 204 goes on (a soft-deleted server comes back only by a restore,
    which starts its guest); a server whose copy is its shelved image has no guest on a
    host that a state could describe. Each way: 409, nothing changed."""
    vm_state, task, why = case
    async with db_pool.acquire() as conn:
        await conn.execute(
            "UPDATE instances SET vm_state = $2, task_state = $3 WHERE uuid = $1",
            UUID(server),
            vm_state,
            task,
        )

    refused = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=reset(state))

    assert refused.status_code == 409, refused.text
    assert why in refused.json()["conflictingRequest"]["message"]
    assert await states(db_pool, server) == (vm_state, task)
    assert await resets_recorded(db_pool, server) == []


async def test_a_member_is_forbidden_and_nothing_changes(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    answer = await client.post(
        f"/v2.1/servers/{server}/action", headers=MEMBER, json=reset("error")
    )

    assert answer.status_code == 403, answer.text
    assert answer.json()["forbidden"]["message"] == (
        "Policy doesn't allow os_compute_api:os-admin-actions:reset_state to be performed."
    )
    assert await states(db_pool, server) == ("active", "powering-off")
    assert await resets_recorded(db_pool, server) == []


@pytest.mark.parametrize(
    "body",
    [
        reset("stopped"),
        reset("deleted"),
        reset("ACTIVE"),
        reset(None),
        reset(1),
        {"os-resetState": {}},
        {"os-resetState": {"state": "error", "force": True}},
        {"os-resetState": "error"},
        {"os-resetState": None},
    ],
)
async def test_any_other_state_is_a_400_and_nothing_changes(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str, body: dict[str, object]
) -> None:
    answer = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=body)

    assert answer.status_code == 400, answer.text
    assert "os-resetState" in answer.text or "['active', 'error']" in answer.text
    assert await states(db_pool, server) == ("active", "powering-off")
    assert await resets_recorded(db_pool, server) == []


async def test_a_deleted_server_is_a_404(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET deleted_at = now() WHERE uuid = $1", UUID(server))

    answer = await client.post(f"/v2.1/servers/{server}/action", headers=ADMIN, json=reset("error"))

    assert answer.status_code == 404, answer.text


async def test_two_resets_at_once_both_apply_and_both_are_recorded(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    action = f"/v2.1/servers/{server}/action"

    answers = await asyncio.gather(
        client.post(action, headers=ADMIN, json=reset("error")),
        client.post(action, headers=ADMIN, json=reset("active")),
    )

    assert [a.status_code for a in answers] == [202, 202]
    vm_state, task = await states(db_pool, server)
    assert (vm_state in ("error", "active"), task) == (True, None)
    assert await resets_recorded(db_pool, server) == ["Success", "Success"]
    async with db_pool.acquire() as conn:
        open_actions = await conn.fetchval(
            "SELECT count(*) FROM instance_actions WHERE finish_time IS NULL AND action = $1",
            "resetState",
        )
    assert open_actions == 0


@pytest.fixture
async def outage_client(
    settings: Settings, database_url: str, pg_proxy: TcpProxy, transport: AmqpTransport
) -> AsyncIterator[httpx.AsyncClient]:
    pool = await create_pool(
        url_through(database_url, pg_proxy.address),
        DatabaseSettings(connect_timeout=5, acquire_timeout=1, command_timeout=2),
    )
    app = create_app(settings, pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http
    pool.terminate()


@pytest.mark.parametrize("cut_after", [b"resetState", b"COMMIT"])
async def test_a_reset_whose_database_call_fails_once_is_whole_or_absent_then_repeats(
    outage_client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    pg_proxy: TcpProxy,
    server: str,
    cut_after: bytes,
) -> None:
    action = f"/v2.1/servers/{server}/action"
    # Look the server up first, so the cut falls inside the reset's own transaction.
    assert (await outage_client.get(f"/v2.1/servers/{server}", headers=ADMIN)).status_code == 200
    pg_proxy.cut_after(cut_after)

    failed = await outage_client.post(action, headers=ADMIN, json=reset("error"))

    assert failed.status_code == 503, failed.text
    assert "serviceUnavailable" in failed.json()
    recorded = await resets_recorded(db_pool, server)
    if recorded:  # the COMMIT reached PostgreSQL: all of it happened
        assert await states(db_pool, server) == ("error", None)
        assert recorded == ["Success"]
    else:
        assert await states(db_pool, server) == ("active", "powering-off")
    await pg_proxy.restore()
    again = await outage_client.post(action, headers=ADMIN, json=reset("error"))
    assert again.status_code == 202, again.text
    assert await states(db_pool, server) == ("error", None)


async def test_a_server_whose_rebuild_failed_is_not_made_active(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, server: str
) -> None:
    """Finding 41: a rebuild that failed leaves its server in ERROR, its old guest perhaps
    destroyed and no new one running. A reset to ACTIVE is refused (409, nothing
    changed); to ERROR it is not, and a rebuild that succeeds lifts the refusal."""
    uuid = UUID(server)
    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE instances SET vm_state = 'error' WHERE uuid = $1", uuid)
        await conn.execute(
            """INSERT INTO instance_actions (instance_uuid, action, request_id, finish_time,
                                             result, message)
               VALUES ($1, 'rebuild', 'req-failed', now(), 'Error', 'spawn failed')""",
            uuid,
        )
    action = f"/v2.1/servers/{server}/action"
    before = await states(db_pool, server)

    refused = await client.post(action, headers=ADMIN, json=reset("active"))
    assert refused.status_code == 409, refused.text
    assert "last rebuild failed" in refused.json()["conflictingRequest"]["message"]
    assert await states(db_pool, server) == before
    to_error = await client.post(action, headers=ADMIN, json=reset("error"))
    assert to_error.status_code == 202, to_error.text
    again = await client.post(action, headers=ADMIN, json=reset("active"))
    assert again.status_code == 409, again.text

    async with db_pool.acquire() as conn:
        await conn.execute(
            """INSERT INTO instance_actions (instance_uuid, action, request_id, finish_time,
                                             result)
               VALUES ($1, 'rebuild', 'req-done', now(), 'Success')""",
            uuid,
        )
    allowed = await client.post(action, headers=ADMIN, json=reset("active"))
    assert allowed.status_code == 202, allowed.text
    assert await states(db_pool, server) == ("active", None)
