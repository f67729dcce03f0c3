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

import httpx
import pytest

from tests.broker import AMQP_URL
from tests.e2e.cloud import CIRROS_ID, Cloud, CloudConfig
from tests.e2e.outage import (
    assert_nothing_restarted,
    assert_settled_whole,
    cut_when,
    pids_of,
    proxy_to,
    unlimited_quota,
)
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

HOSTS = tuple(f"bo-{i}" for i in range(1, 5))
BOOTS = 200
CLIENTS = 20
OUTAGE_S = 8.0
SETTLE = 180.0


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    async with proxy_to(AMQP_URL, 5672) as running:
        yield running


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
    pids = pids_of(cloud)
    await unlimited_quota(cloud)
    pending = iter(range(BOOTS))
    results: list[tuple[int, str | None]] = []

    async def client() -> None:
        async with cloud.http(cloud.admin_token) as http:
            for index in pending:
                results.append(await boot(http, index))

    def quarter_done() -> bool:
        return len(results) >= BOOTS // 4

    await asyncio.gather(
        cut_when(proxy, quarter_done, OUTAGE_S), *(client() for _ in range(CLIENTS))
    )
    accepted = [server_id for code, server_id in results if server_id is not None]
    refused = [code for code, server_id in results if server_id is None]
    assert len(results) == BOOTS
    assert set(refused) <= {503}, refused
    assert len(accepted) >= BOOTS // 2
    await assert_settled_whole(cloud, accepted, SETTLE)
    assert_nothing_restarted(cloud, pids)
