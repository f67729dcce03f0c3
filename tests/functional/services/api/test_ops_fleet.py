"""The operator's page's data and actions: hosts and their states, servers, moves, pins,
events; disable, enable, force down and up, evacuate — each through keel's own path.

keel-api in-process against real PostgreSQL and RabbitMQ, read with an admin's
``X-Auth-Token`` as a script would (the session is :mod:`test_ops_session`'s subject).
Compute services' rows are left as their agents would have left them.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from shared.config import DatabaseSettings, FencingSettings, Settings
from shared.context import RequestContext
from shared.db import compute_nodes, instances, move_requests, moves, recoveries, services
from shared.db.pool import create_pool
from shared.objects.migration import LIVE_MIGRATION, MigrationStatus
from shared.rpc.amqp import AmqpTransport
from shared.versions import SERVICE_VERSION, apis_for
from tests.broker import remove_exchange
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.api.conftest import (
    ADMIN,
    Recorder,
    add_compute,
    add_image,
)
from tests.functional.services.api.test_evacuate_fenced import active_on, agent_left

pytestmark = pytest.mark.functional

DOWN, FENCE, MARGIN = 4.0, 8.0, 2.0
FENCED = FENCE + MARGIN + 1
OUTAGE = DatabaseSettings(connect_timeout=5, acquire_timeout=1, command_timeout=2)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "service_down_time": DOWN,
            "fencing": FencingSettings(margin=MARGIN),
            "service_version_cache_ttl": 0.0,
            "move_timeout": 600.0,
        }
    )


async def hosts(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    answer = await client.get("/ops/api/hosts", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return {host["host"]: host for host in answer.json()["hosts"]}


async def act(
    client: httpx.AsyncClient, host: dict[str, Any], action: str, **body: str
) -> httpx.Response:
    return await client.post(f"/ops/api/hosts/{host['uuid']}/{action}", headers=ADMIN, json=body)


async def evacuate(client: httpx.AsyncClient, server_id: str) -> httpx.Response:
    return await client.post(f"/ops/api/servers/{server_id}/evacuate", headers=ADMIN)


async def records_of(pool: asyncpg.Pool, server_id: str) -> list[str]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT status FROM migrations WHERE instance_uuid = $1 ORDER BY id", UUID(server_id)
        )
    return [row["status"] for row in rows]


async def set_forced_down(pool: asyncpg.Pool, host: str) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET forced_down = true
                WHERE host = $1 AND "binary" = 'keel-compute'""",
            host,
        )


@pytest.fixture
async def fleet(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, conductor: Recorder
) -> dict[str, str]:
    """One server on each of five hosts, their agents of this release and just heard."""
    await add_image(db_pool)
    servers = {
        host: await active_on(client, db_pool, host, f"on-{host}")
        for host in ("alive", "cut", "gone", "old", "forced")
    }
    for host in servers:
        await agent_left(db_pool, host, silent=0)
    return servers


async def test_hosts_show_every_state_with_why_and_what_may_be_done(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, fleet: dict[str, str]
) -> None:
    await agent_left(db_pool, "cut", silent=DOWN + 1)
    await agent_left(db_pool, "gone", silent=FENCED)
    await agent_left(db_pool, "old", silent=3600, fence=None)
    await set_forced_down(db_pool, "forced")

    shown = await hosts(client)

    assert {name: host["state"] for name, host in shown.items()} == {
        "alive": "up",
        "cut": "down",
        "gone": "fenced",
        "old": "down",
        "forced": "forced down",
    }
    assert [name for name, host in shown.items() if host["fenced"]] == ["forced", "gone"]
    assert 1 <= shown["cut"]["fenced_in"] <= FENCE + MARGIN
    assert "may be evacuated" in shown["cut"]["fence_reason"]
    assert shown["alive"]["fence_lease"] == FENCE
    assert shown["old"]["fence_lease"] is None
    assert "no armed host fence" in shown["old"]["fence_reason"]
    assert shown["alive"]["version"] == SERVICE_VERSION
    assert shown["alive"]["servers"] == 1
    assert shown["alive"]["servers_by_status"] == {"ACTIVE": 1}
    assert shown["alive"]["actions"] == {
        "disable": True,
        "enable": False,
        "force_down": True,
        "force_up": False,
        "evacuate": False,
        "drain": True,
    }
    assert shown["cut"]["actions"]["drain"] is False, "a host that is down is not drained"
    assert shown["gone"]["actions"]["evacuate"] is True
    assert shown["forced"]["actions"]["force_up"] is True

    listed = await client.get(f"/ops/api/hosts/{shown['alive']['uuid']}/servers", headers=ADMIN)
    assert listed.status_code == 200
    assert listed.json()["servers"][0]["id"] == fleet["alive"]
    assert listed.json()["servers"][0]["status"] == "ACTIVE"
    bad = await client.get("/ops/api/hosts/not-a-uuid/servers", headers=ADMIN)
    assert bad.status_code == 400
    unknown = await client.get(f"/ops/api/hosts/{UUID(int=7)}/servers", headers=ADMIN)
    assert unknown.status_code == 404


async def test_disable_with_a_reason_then_enable(
    client: httpx.AsyncClient, fleet: dict[str, str]
) -> None:
    host = (await hosts(client))["alive"]
    no_reason = await act(client, host, "disable")
    assert no_reason.status_code == 400
    assert "reason" in no_reason.json()["badRequest"]["message"]

    twice = await asyncio.gather(
        act(client, host, "disable", reason="patching"),
        act(client, host, "disable", reason="patching"),
    )
    assert [answer.status_code for answer in twice] == [200, 200]
    shown = (await hosts(client))["alive"]
    assert (shown["disabled"], shown["disabled_reason"]) == (True, "patching")
    assert shown["actions"]["enable"] is True

    assert (await act(client, host, "enable")).status_code == 200
    shown = (await hosts(client))["alive"]
    assert (shown["disabled"], shown["disabled_reason"]) == (False, None)


async def test_evacuate_only_once_the_host_is_fenced_one_move_per_server(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, fleet: dict[str, str]
) -> None:
    server = fleet["alive"]
    refused = await evacuate(client, server)
    assert refused.status_code == 400
    assert refused.json()["badRequest"]["message"] == "Compute service of alive is still in use."
    assert await records_of(db_pool, server) == []

    host = (await hosts(client))["alive"]
    assert (await act(client, host, "force-down")).status_code == 200
    assert (await hosts(client))["alive"]["state"] == "forced down"

    answers = await asyncio.gather(evacuate(client, server), evacuate(client, server))
    assert sorted(a.status_code for a in answers) == [202, 409]
    accepted = next(a for a in answers if a.status_code == 202).json()
    assert accepted == {"server_id": server, "name": "on-alive", "source": "alive"}
    assert await records_of(db_pool, server) == ["accepted"]

    in_flight = (await client.get("/ops/api/moves", headers=ADMIN)).json()["moves"]
    assert [(m["server_id"], m["type"], m["status"]) for m in in_flight] == [
        (server, "evacuation", "accepted")
    ]
    assert 590 <= in_flight[0]["deadline_in"] <= 600
    assert "KEEL_MOVE_TIMEOUT" in in_flight[0]["deadline"]

    events = (await client.get("/ops/api/events", headers=ADMIN)).json()
    assert events["fenced"] == ["alive"]
    assert [e["server_id"] for e in events["evacuations"]] == [server]
    assert events["evacuations"][0]["user_id"] == "root"
    assert events["evacuations"][0]["asked_by"] == "root"  # a static token's user id


async def test_a_live_migration_under_way_shows_its_deadline_then_what_it_waits_for(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, fleet: dict[str, str]
) -> None:
    server = UUID(fleet["alive"])
    async with db_pool.acquire() as conn:
        instance = await instances.get(conn, server)
        assert instance.compute_id is not None
        node = await compute_nodes.get_by_id(conn, instance.compute_id)
    operator = RequestContext(user_id="operator", roles=("admin",))
    migration = await move_requests.record(
        db_pool, operator, LIVE_MIGRATION, instance_uuid=server, source=node
    )
    assert migration is not None
    S = MigrationStatus
    for before, now in ((S.ACCEPTED, S.PREPARING), (S.PREPARING, S.RUNNING)):
        async with db_pool.acquire() as conn:
            assert await moves.swap_status(conn, migration.uuid, expected=[before], new=now)
        (shown,) = (await client.get("/ops/api/moves", headers=ADMIN)).json()["moves"]
        assert (shown["type"], shown["status"]) == ("live-migration", now.value)
        assert "KEEL_MOVE_TIMEOUT" in shown["deadline"]

    async with db_pool.acquire() as conn:
        assert await moves.swap_status(
            conn, migration.uuid, expected=[S.RUNNING], new=S.POST_MIGRATING
        )
    (switching,) = (await client.get("/ops/api/moves", headers=ADMIN)).json()["moves"]
    assert switching["deadline"] is None
    assert "to start the server (the switch-over)" in switching["waiting_for"]


async def test_force_up_is_refused_while_evacuations_away_are_unconfirmed(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, fleet: dict[str, str]
) -> None:
    server = fleet["forced"]
    host = (await hosts(client))["forced"]
    assert (await act(client, host, "force-down")).status_code == 200
    assert (await evacuate(client, server)).status_code == 202
    async with db_pool.acquire() as conn:
        migration = await moves.in_progress(conn, UUID(server))
        assert migration is not None
        await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.ACCEPTED], new=MigrationStatus.DONE
        )

    waiting = (await client.get("/ops/api/moves", headers=ADMIN)).json()["moves"][0]
    assert waiting["status"] == "done"
    assert waiting["waiting_for"].startswith("forced's agent to remove the old copy")
    refused = await act(client, host, "force-up")
    assert refused.status_code == 400
    assert "not confirmed" in refused.json()["badRequest"]["message"]
    assert (await hosts(client))["forced"]["forced_down"] is True


async def test_an_evacuation_whose_cast_fails_is_withdrawn_and_can_be_asked_again(
    client: httpx.AsyncClient,
    *,
    db_pool: asyncpg.Pool,
    settings: Settings,
    amqp_url: str,
    exchange: str,
    fleet: dict[str, str],
) -> None:
    server = fleet["forced"]
    await set_forced_down(db_pool, "forced")
    # keel-api publishing where no conductor listens: the cast is unroutable, once.
    lost_exchange = f"{exchange}-lost"
    lost = AmqpTransport(amqp_url, lost_exchange, queue_expires=60, connect_timeout=10)
    await lost.connect()
    app = create_app(settings, db_pool, ConductorAPI(lost), ComputeAPI(lost))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
        ) as cut_off:
            answer = await evacuate(cut_off, server)
    finally:
        await lost.close()
        await remove_exchange(lost_exchange, [])
    assert answer.status_code == 503
    assert "not moved" in answer.json()["serviceUnavailable"]["message"]
    assert await records_of(db_pool, server) == ["error"]

    again = await evacuate(client, server)
    assert again.status_code == 202, again.text
    assert await records_of(db_pool, server) == ["error", "accepted"]


async def test_drain_starts_one_host_task_whose_progress_the_page_shows(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool, fleet: dict[str, str]
) -> None:
    host = (await hosts(client))["alive"]
    unsure = await client.post(
        f"/ops/api/hosts/{host['uuid']}/drain", headers=ADMIN, json={"cold_fallback": "maybe"}
    )
    assert unsure.status_code == 400
    assert "A drain takes" in unsure.json()["badRequest"]["message"]
    bad = await client.post(
        f"/ops/api/hosts/{host['uuid']}/drain", headers=ADMIN, json={"parallel": "many"}
    )
    assert bad.status_code == 400

    body = {"parallel": 2, "cold_fallback": True}
    twice = await asyncio.gather(
        *(
            client.post(f"/ops/api/hosts/{host['uuid']}/drain", headers=ADMIN, json=body)
            for _ in range(2)
        )
    )

    assert sorted(answer.status_code for answer in twice) == [200, 202]
    assert len({answer.json()["task"] for answer in twice}) == 1
    shown = (await hosts(client))["alive"]
    assert shown["host_task"] == twice[0].json()["number"]
    assert shown["actions"]["drain"] is False
    progress = await client.get("/ops/api/host-tasks", headers=ADMIN)
    assert progress.status_code == 200
    (task,) = progress.json()["tasks"]
    assert (task["kind"], task["host"], task["status"], task["parallel"]) == (
        "drain",
        "alive",
        "running",
        2,
    )
    assert task["deadline_in"] > 3500
    down = (await hosts(client))["cut"]
    await agent_left(db_pool, "cut", silent=DOWN + 1)
    refused = await client.post(f"/ops/api/hosts/{down['uuid']}/drain", headers=ADMIN, json=body)
    assert refused.status_code == 409
    assert "is down" in refused.json()["conflictingRequest"]["message"]


async def test_versions_say_what_an_upgrade_waits_for(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "laggard")  # registered as release 1
    answer = await client.get("/ops/api/versions", headers=ADMIN)
    assert answer.status_code == 200
    body = answer.json()
    compute = next(pin for pin in body["pins"] if pin["api"] == "compute")
    assert compute["cap"] == apis_for(1).compute
    assert compute["latest"] == apis_for(SERVICE_VERSION).compute
    assert [(s["host"], s["version"]) for s in body["behind"]] == [("laggard", 1)]
    assert "laggard" in body["waiting_for"]
    assert "compute RPC capped" in body["waiting_for"]

    async with db_pool.acquire() as conn:
        await conn.execute("UPDATE services SET version = $1", SERVICE_VERSION)
    body = (await client.get("/ops/api/versions", headers=ADMIN)).json()
    assert body["behind"] == []
    assert body["waiting_for"].startswith("Nothing")


async def test_events_list_the_automatic_recoveries(
    client: httpx.AsyncClient, db_pool: asyncpg.Pool
) -> None:
    await add_compute(db_pool, "recovered")
    async with db_pool.acquire() as conn:
        service = await services.find_compute(conn, "recovered", DOWN)
        assert service is not None
        started = await recoveries.start(conn, service)
        await recoveries.finish(conn, started, evacuations=3, skipped=1)
    body = (await client.get("/ops/api/events", headers=ADMIN)).json()
    assert [(r["host"], r["evacuations"], r["skipped"]) for r in body["recoveries"]] == [
        ("recovered", 3, 1)
    ]
    assert body["auto_evacuate"] == "off"


async def test_while_the_database_is_away_the_page_answers_503_never_500(
    settings: Settings,
    database_url: str,
    pg_proxy: TcpProxy,
    transport: AmqpTransport,
) -> None:
    pool = await create_pool(url_through(database_url, pg_proxy.address), OUTAGE)
    app = create_app(settings, pool, ConductorAPI(transport), ComputeAPI(transport))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
        ) as http:
            assert (await http.get("/ops/api/hosts", headers=ADMIN)).status_code == 200
            await pg_proxy.cut()
            for route in ("/ops/api/hosts", "/ops/api/moves", "/ops/api/events"):
                assert (await http.get(route, headers=ADMIN)).status_code == 503, route
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            login = await http.post("/ops/login", headers=form, content="username=a&password=b")
            assert login.status_code == 503
            assert (await http.get("/ops/")).status_code == 200  # the form needs no database
            await pg_proxy.restore()
            assert (await http.get("/ops/api/hosts", headers=ADMIN)).status_code == 200
    finally:
        pool.terminate()
