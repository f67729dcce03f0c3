"""A real broker outage during 200 concurrent boots: nothing restarts, nothing is lost.

Every keel process reaches RabbitMQ through a proxy the test cuts and restores (the
shared server itself is never touched): connections drop at once and new ones are
refused, as when RabbitMQ stops. Twenty clients keep creating servers meanwhile. A
create the API answered 202 must end ACTIVE or ERROR once the broker is back; one it
could not hand to the conductor is answered 503 and leaves no server. No process is
restarted, every build holds one claim, and every node's usage is the sum of its claims.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest

from shared.db import allocations
from tests.broker import AMQP_URL
from tests.e2e.cloud import ADMIN, CIRROS_ID, Cloud, CloudConfig
from tests.faults.proxy import TcpProxy
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

HOSTS = tuple(f"bo-{i}" for i in range(1, 5))
BOOTS = 200
CLIENTS = 20
OUTAGE_S = 8.0
SETTLE = 180.0


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    target = urlsplit(AMQP_URL)
    running = TcpProxy(target.hostname or "127.0.0.1", target.port or 5672)
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
        broker_address=proxy.address,
        env=(("KEEL_COMPUTE__DRIVER", "fake"),),
    )


async def boot(http: httpx.AsyncClient, index: int) -> tuple[int, str | None]:
    """One create: its status code, and the server id when it was accepted."""
    body = {"server": {"name": f"bo-{index}", "imageRef": str(CIRROS_ID), "flavorRef": "1"}}
    try:
        response = await http.post("servers", json=body)
    except httpx.HTTPError:
        return 0, None
    if response.status_code == 202:
        return 202, str(response.json()["server"]["id"])
    return response.status_code, None


async def test_every_accepted_boot_settles_after_a_broker_outage(
    cloud: Cloud, proxy: TcpProxy
) -> None:
    pids = {name: p.popen.pid for name, p in cloud.processes.items()}
    unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
    async with cloud.http(cloud.admin_token) as http:
        (await http.put(f"os-quota-sets/{ADMIN['project_id']}", json=unlimited)).raise_for_status()
    pending = iter(range(BOOTS))
    results: list[tuple[int, str | None]] = []

    async def client() -> None:
        async with cloud.http(cloud.admin_token) as http:
            for index in pending:
                results.append(await boot(http, index))

    async def quarter_done() -> bool:
        return len(results) >= BOOTS // 4

    async def outage() -> None:
        await wait_until(quarter_done, what="a quarter of the boots", timeout=120)
        await proxy.cut()
        await asyncio.sleep(OUTAGE_S)
        await proxy.restore()

    await asyncio.gather(outage(), *(client() for _ in range(CLIENTS)))
    accepted = [server_id for code, server_id in results if server_id is not None]
    refused = [code for code, server_id in results if server_id is None]
    assert len(results) == BOOTS
    assert set(refused) <= {503}, refused
    assert len(accepted) >= BOOTS // 2

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
        claims = await conn.fetch(
            "SELECT instance_uuid, count(*) AS n FROM allocations GROUP BY instance_uuid"
            " HAVING count(*) > 1"
        )
        leftover = await conn.fetchval(
            "SELECT count(*) FROM instances WHERE deleted_at IS NULL"
            " AND NOT (uuid = ANY($1::uuid[]))",
            accepted,
        )
        assert await allocations.usage_drift(conn) == []
    by_state = {row["vm_state"]: row["count"] for row in states}
    assert set(by_state) <= {"active", "error"}, by_state
    assert sum(by_state.values()) == len(accepted)
    assert claims == []
    assert leftover == 0, "a refused create left a server behind"
    for name, process in cloud.processes.items():
        assert process.popen.poll() is None, f"{name} exited:\n{process.tail()}"
        assert process.popen.pid == pids[name]
