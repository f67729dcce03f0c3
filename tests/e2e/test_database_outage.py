"""A real database outage under a running cloud: nothing restarts, everything recovers.

keel-api, keel-conductor and keel-scheduler reach PostgreSQL through a proxy the test
cuts and restores; the shared server itself is never touched. While it is cut the API
answers 503 with a fault and ``Retry-After``, and the services log their failed
heartbeats as single lines; once it is restored the same processes serve again: the
API answers 2xx and a new server goes through the conductor and the scheduler. No
process is restarted and no log holds a traceback.

The cloud has no compute agents: their heartbeats reach the database through the
conductor's RPC handlers, whose failures are the messaging layer's to settle and log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.e2e.cloud import CIRROS_ID, OUTAGE_LEASE, PG_SERVER, Cloud, CloudConfig
from tests.e2e.outage import assert_no_tracebacks, assert_nothing_restarted, proxy_to
from tests.faults.proxy import TcpProxy
from tests.polling import wait_until

pytestmark = pytest.mark.e2e

#: Bound on anything that should happen within a few report intervals.
SOON = 20.0
CONTROL_PLANE = ("api", "conductor", "scheduler1")


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[TcpProxy]:
    async with proxy_to(PG_SERVER, 5432) as running:
        yield running


@pytest.fixture(scope="module")
def cloud_config(proxy: TcpProxy) -> CloudConfig:
    return CloudConfig(computes=(), database_address=proxy.address, self_fence_after=OUTAGE_LEASE)


async def wait_for_log(cloud: Cloud, name: str, text: str, times: int = 1) -> None:
    async def found() -> bool:
        return cloud.logs()[name].count(text) >= times

    await wait_until(found, what=f"{name} logging {text!r} {times} time(s)", timeout=SOON)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["serviceUnavailable"]["code"] == 503
    assert int(response.headers["Retry-After"]) > 0
    assert response.headers["x-openstack-request-id"].startswith("req-")


async def server_status(http: httpx.AsyncClient, server_id: str) -> str:
    response = await http.get(f"servers/{server_id}")
    assert response.status_code == 200, response.text
    status: str = response.json()["server"]["status"]
    return status


async def test_database_outage_and_recovery_without_restarts(cloud: Cloud, proxy: TcpProxy) -> None:
    pids = {name: cloud.processes[name].popen.pid for name in CONTROL_PLANE}
    body = {"server": {"name": "after", "imageRef": str(CIRROS_ID), "flavorRef": "1"}}
    async with cloud.http(cloud.admin_token) as http:
        assert (await http.get("servers")).status_code == 200

        await proxy.cut()
        assert_unavailable(await http.get("servers"))
        assert_unavailable(await http.get("flavors/detail"))
        assert_unavailable(await http.post("servers", json=body))
        failed = "heartbeat failed: the database is unavailable"
        for name in ("conductor", "scheduler1"):  # several heartbeats fail, one line each
            await wait_for_log(cloud, name, failed, times=3)
        assert_unavailable(await http.get("servers"))

        await proxy.restore()

        async def api_answers() -> bool:
            return (await http.get("servers")).status_code == 200

        await wait_until(api_answers, what="the API answering again", timeout=SOON)
        for name in ("conductor", "scheduler1"):
            await wait_for_log(cloud, name, "heartbeat works again")
        created = await http.post("servers", json=body)
        assert created.status_code == 202, created.text
        server_id = created.json()["server"]["id"]

        async def settled() -> bool:
            return await server_status(http, server_id) == "ERROR"  # no compute hosts

        await wait_until(settled, what="the new server being scheduled", timeout=SOON)

    assert_nothing_restarted(cloud, pids)
    assert_no_tracebacks(cloud)
