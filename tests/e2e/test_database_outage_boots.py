"""A database outage in the middle of concurrent boots, with compute agents running.

Every keel process reaches PostgreSQL through a proxy the test cuts for a few seconds
while ten clients create servers, each retrying a create answered 503 after a pause, as
``Retry-After`` asks. A create answered 202 must end ACTIVE or ERROR once the database is
back (none left in BUILD); a create the API could not record is a 503 with a fault body,
never a 500. When the connection drops after a commit reached the database, the client
sees a 503 for a server that exists: keel-api withdraws it once the database answers
again, so no server is left that nobody builds. No process is restarted, no log holds a
traceback, every build holds one claim and usage adds up on every node.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.e2e.cloud import CIRROS_ID, PG_SERVER, Cloud, CloudConfig
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

HOSTS = ("do-1", "do-2", "do-3")
BOOTS = 100
CLIENTS = 10
OUTAGE_S = 6.0
SETTLE = 180.0
#: How long a client waits before it tries a refused create again.
RETRY_S = 0.5


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    async with proxy_to(PG_SERVER, 5432) as running:
        yield running


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
    pids = pids_of(cloud)
    await unlimited_quota(cloud)
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

    def quarter_done() -> bool:
        return len(results) >= BOOTS // 4

    await asyncio.gather(
        cut_when(proxy, quarter_done, OUTAGE_S), *(client() for _ in range(CLIENTS))
    )
    accepted = [server_id for _, server_id, _ in results if server_id is not None]
    refused = [(code, body) for code, server_id, body in results if server_id is None]
    assert len(accepted) == BOOTS
    assert refused, "the outage refused no create: it came too late"
    assert {code for code, _ in refused} == {503}, refused
    assert all("serviceUnavailable" in body for _, body in refused)
    await assert_settled_whole(cloud, accepted, SETTLE)
    assert_nothing_restarted(cloud, pids)
    tracebacks = [name for name, text in cloud.logs().items() if "Traceback" in text]
    assert tracebacks == [], "\n".join(cloud.logs()[name][-3000:] for name in tracebacks)
