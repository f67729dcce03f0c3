"""A database outage in the middle of concurrent boots, with compute agents running.

Every keel process reaches PostgreSQL through a proxy the test cuts for a few seconds
while ten clients create servers, each retrying a create answered 503 after a pause, as
``Retry-After`` asks. A create answered 202 must end ACTIVE or ERROR once the database is
back (none left in BUILD); a create the API could not record is a 503 with a fault body,
never a 500, and leaves no server. No process is restarted, no log
holds a traceback, every build holds one claim and usage adds up on every node.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest

from shared.db import allocations
from tests.e2e.cloud import ADMIN, CIRROS_ID, PG_SERVER, Cloud, CloudConfig
from tests.faults.proxy import TcpProxy
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

HOSTS = ("do-1", "do-2", "do-3")
BOOTS = 100
CLIENTS = 10
OUTAGE_S = 6.0
SETTLE = 180.0
#: How long a client waits before it tries a refused create again.
RETRY_S = 0.5


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    target = urlsplit(PG_SERVER)
    running = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await running.start()
    yield running
    await running.close()


@pytest.fixture(scope="module")
def cloud_config(proxy: TcpProxy) -> CloudConfig:
    return CloudConfig(
        computes=HOSTS,
        vcpus=64,
        memory_mb=65536,
        local_gb=1000,
        database_address=proxy.address,
        env=(("KEEL_COMPUTE__DRIVER", "fake"),),
    )


async def boot(http: httpx.AsyncClient, index: int) -> tuple[int, str | None, dict[str, object]]:
    body = {"server": {"name": f"do-{index}", "imageRef": str(CIRROS_ID), "flavorRef": "1"}}
    response = await http.post("servers", json=body)
    answer = response.json()
    if response.status_code == 202:
        return 202, str(answer["server"]["id"]), answer
    return response.status_code, None, answer


async def test_boots_across_a_database_outage_all_settle(cloud: Cloud, proxy: TcpProxy) -> None:
    pids = {name: p.popen.pid for name, p in cloud.processes.items()}
    unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
    async with cloud.http(cloud.admin_token) as http:
        (await http.put(f"os-quota-sets/{ADMIN['project_id']}", json=unlimited)).raise_for_status()
    pending = iter(range(BOOTS))
    results: list[tuple[int, str | None, dict[str, object]]] = []

    async def client() -> None:
        async with cloud.http(cloud.admin_token) as http:
            for index in pending:
                while True:
                    results.append(await boot(http, index))
                    if results[-1][0] != 503:
                        break
                    await asyncio.sleep(RETRY_S)

    async def quarter_done() -> bool:
        return len(results) >= BOOTS // 4

    async def outage() -> None:
        await wait_until(quarter_done, what="a quarter of the boots", timeout=120)
        await proxy.cut()
        await asyncio.sleep(OUTAGE_S)
        await proxy.restore()

    await asyncio.gather(outage(), *(client() for _ in range(CLIENTS)))
    accepted = [server_id for _, server_id, _ in results if server_id is not None]
    refused = [(code, body) for code, server_id, body in results if server_id is None]
    assert len(accepted) == BOOTS
    assert refused, "the outage refused no create: it came too late"
    assert {code for code, _ in refused} == {503}, refused
    assert all("serviceUnavailable" in body for _, body in refused)

    async def settled() -> bool:
        async with cloud.pool.acquire() as conn:
            building: int = await conn.fetchval(
                "SELECT count(*) FROM instances WHERE uuid = ANY($1::uuid[])"
                " AND vm_state = 'building'",
                accepted,
            )
        return building == 0

    await wait_until(settled, what="every accepted server settling", timeout=SETTLE)
    async with cloud.pool.acquire() as conn:
        states = await conn.fetch(
            "SELECT vm_state, count(*) FROM instances WHERE uuid = ANY($1::uuid[])"
            " GROUP BY vm_state",
            accepted,
        )
        doubled = await conn.fetch(
            "SELECT instance_uuid FROM allocations GROUP BY instance_uuid HAVING count(*) > 1"
        )
        leftover = await conn.fetchval(
            "SELECT count(*) FROM instances WHERE deleted_at IS NULL"
            " AND NOT (uuid = ANY($1::uuid[]))",
            accepted,
        )
        assert await allocations.usage_drift(conn) == []
    by_state = {row["vm_state"]: row["count"] for row in states}
    assert set(by_state) <= {"active", "error"}, by_state
    assert doubled == []
    assert leftover == 0, "a refused create left a server behind"
    for name, process in cloud.processes.items():
        assert process.popen.poll() is None, f"{name} exited:\n{process.tail()}"
        assert process.popen.pid == pids[name]
    tracebacks = [name for name, text in cloud.logs().items() if "Traceback" in text]
    assert tracebacks == [], "\n".join(cloud.logs()[name][-3000:] for name in tracebacks)
