"""keel-api while its database is away: 503 with a fault and Retry-After, then 2xx again.

The API's pool reaches PostgreSQL through a proxy the test cuts and restores (a real
outage for keel; the shared server is never touched). The same application object, and
so the same pool, answers before, during and after.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.servers.create import _withdraw_unconfirmed
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import DatabaseSettings, Settings
from shared.db.pool import create_pool
from shared.rpc.amqp import AmqpTransport
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.api.conftest import ADMIN, MEMBER, Recorder, add_image
from tests.functional.services.api.test_servers import server_body
from tests.polling import wait_until

pytestmark = pytest.mark.functional

SETTINGS = DatabaseSettings(connect_timeout=5, acquire_timeout=1, command_timeout=2)


@pytest.fixture
async def outage_client(
    settings: Settings, database_url: str, pg_proxy: TcpProxy, transport: AmqpTransport
) -> AsyncIterator[httpx.AsyncClient]:
    pool = await create_pool(url_through(database_url, pg_proxy.address), SETTINGS)
    app = create_app(settings, pool, ConductorAPI(transport), ComputeAPI(transport))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
    ) as http:
        yield http
    pool.terminate()


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    fault = response.json()["serviceUnavailable"]
    assert fault["code"] == 503
    assert "database" in fault["message"]
    assert int(response.headers["Retry-After"]) > 0
    assert response.headers["x-openstack-request-id"].startswith("req-")


async def test_503_while_the_database_is_away_then_2xx_without_a_restart(
    outage_client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    pg_proxy: TcpProxy,
    conductor: Recorder,
) -> None:
    await add_image(db_pool)
    assert (await outage_client.get("/v2.1/servers", headers=MEMBER)).status_code == 200

    await pg_proxy.cut()
    assert_unavailable(await outage_client.get("/v2.1/servers", headers=MEMBER))
    assert_unavailable(await outage_client.get("/v2.1/flavors/1", headers=MEMBER))
    assert_unavailable(
        await outage_client.post("/v2.1/servers", headers=MEMBER, json=server_body("during"))
    )
    flavor = {"flavor": {"name": "during", "ram": 64, "vcpus": 1, "disk": 0}}
    assert_unavailable(await outage_client.post("/v2.1/flavors", headers=ADMIN, json=flavor))

    await pg_proxy.restore()
    listed = await outage_client.get("/v2.1/servers", headers=MEMBER)
    assert listed.status_code == 200, listed.text
    assert listed.json()["servers"] == []  # nothing half-created during the outage
    created = await outage_client.post("/v2.1/servers", headers=MEMBER, json=server_body("after"))
    assert created.status_code == 202, created.text
    _, built = await conductor.next_build()
    assert str(built) == created.json()["server"]["id"]


async def test_a_silent_database_is_a_bounded_503(
    outage_client: httpx.AsyncClient, pg_proxy: TcpProxy
) -> None:
    assert (await outage_client.get("/v2.1/flavors", headers=MEMBER)).status_code == 200
    pg_proxy.stall()
    assert_unavailable(await outage_client.get("/v2.1/flavors", headers=MEMBER))
    await pg_proxy.restore()
    assert (await outage_client.get("/v2.1/flavors", headers=MEMBER)).status_code == 200


async def test_a_create_whose_commit_goes_unanswered_leaves_no_server(
    outage_client: httpx.AsyncClient,
    db_pool: asyncpg.Pool,
    pg_proxy: TcpProxy,
    conductor: Recorder,
) -> None:
    await add_image(db_pool)
    # The COMMIT reaches PostgreSQL; its answer never comes back.
    pg_proxy.cut_after(b"COMMIT")
    lost = await outage_client.post("/v2.1/servers", headers=MEMBER, json=server_body("lost"))
    assert_unavailable(lost)
    async with db_pool.acquire() as conn:
        recorded = await conn.fetchrow(
            "SELECT uuid, deleted_at FROM instances WHERE display_name = 'lost'"
        )
    assert recorded is not None, "the commit did not reach the database: nothing to show"
    assert recorded["deleted_at"] is None

    # Once the database answers again, keel-api withdraws it: the 503 was the truth.
    await pg_proxy.restore()

    async def withdrawn() -> bool:
        async with db_pool.acquire() as conn:
            gone = await conn.fetchval(
                "SELECT deleted_at IS NOT NULL FROM instances WHERE uuid = $1", recorded["uuid"]
            )
        return bool(gone)

    await wait_until(withdrawn, what="the unconfirmed server being withdrawn", timeout=30)
    async with db_pool.acquire() as conn:
        message = await conn.fetchval(
            "SELECT message FROM instance_actions WHERE instance_uuid = $1", recorded["uuid"]
        )
        addresses = await conn.fetchval(
            "SELECT count(*) FROM fixed_ips WHERE instance_uuid = $1", recorded["uuid"]
        )
    assert "answered 503" in message
    assert addresses == 0
    listed = await outage_client.get("/v2.1/servers", headers=MEMBER)
    assert listed.json()["servers"] == []
    assert conductor.builds.empty()


async def test_withdrawing_an_unconfirmed_create_twice_at_once_withdraws_it_once(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> None:
    await add_image(db_pool)
    created = await client.post("/v2.1/servers", headers=MEMBER, json=server_body("twice"))
    assert created.status_code == 202, created.text
    instance_uuid = uuid.UUID(created.json()["server"]["id"])
    await conductor.next_build()
    # As if its commit had gone unanswered (the stand-in conductor places nothing).
    await asyncio.gather(*(_withdraw_unconfirmed(db_pool, instance_uuid) for _ in range(2)))
    async with db_pool.acquire() as conn:
        actions = await conn.fetch(
            "SELECT message FROM instance_actions WHERE instance_uuid = $1", instance_uuid
        )
        deleted = await conn.fetchval(
            "SELECT deleted_at IS NOT NULL FROM instances WHERE uuid = $1", instance_uuid
        )
    assert deleted
    assert [row["message"] for row in actions] == [
        "the connection to the database was lost while the server was being recorded; "
        "the request was answered 503"
    ]
