"""Many creates at once, two schedulers, two hosts: never more than a host can hold."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.e2e.cloud import ADMIN, CIRROS_ID, Cloud, CloudConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REQUESTS = 40
SETTLE_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    # Room for exactly 10 m1.tiny (1 vCPU) per host: memory and disk are never the limit.
    return CloudConfig(schedulers=2, vcpus=10, memory_mb=64 * 1024, local_gb=1000)


async def create(http: httpx.AsyncClient, index: int) -> str:
    body = {"server": {"name": f"load-{index}", "flavorRef": "1", "imageRef": str(CIRROS_ID)}}
    response = await http.post("servers", json=body)
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    return server_id


async def settled(http: httpx.AsyncClient, ids: set[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        response = await http.get("servers/detail")
        assert response.status_code == 200, response.text
        mine = [s for s in response.json()["servers"] if s["id"] in ids]
        if len(mine) == len(ids) and all(s["status"] in ("ACTIVE", "ERROR") for s in mine):
            return mine
        if time.monotonic() > deadline:
            return mine
        await asyncio.sleep(1)


async def test_concurrent_creates_fill_both_hosts_and_no_more(cloud: Cloud) -> None:
    async with cloud.http(cloud.admin_token) as http:
        # Capacity, not the project's quota, is what this test exhausts.
        unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
        quota = await http.put(f"os-quota-sets/{ADMIN['project_id']}", json=unlimited)
        assert quota.status_code == 200, quota.text
        ids = await asyncio.gather(*(create(http, i) for i in range(REQUESTS)))
        servers = await settled(http, set(ids))
        hypervisors = (await http.get("os-hypervisors/detail")).json()["hypervisors"]

    assert len(servers) == REQUESTS
    assert Counter(s["status"] for s in servers) == {"ACTIVE": 20, "ERROR": 20}
    for server in servers:
        if server["status"] == "ERROR":
            assert "No valid host was found" in server["fault"]["message"]
    assert len(hypervisors) == 2
    for hypervisor in hypervisors:
        assert hypervisor["vcpus_used"] <= hypervisor["vcpus"] == 10
    assert sum(h["vcpus_used"] for h in hypervisors) == 20
    on_disk = {
        host: sum(1 for p in (cloud.state_dir(host) / "instances").iterdir() if p.name[0] != ".")
        for host in cloud.config.computes
    }
    assert on_disk == {"compute1": 10, "compute2": 10}
