"""Server groups with the real processes: anti-affinity under concurrent boots, and kept
by a cold migration and an evacuation (which says which member it cannot place).

Three hosts with the local driver, two schedulers.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.e2e.cloud import ADMIN, CIRROS_ID, Cloud, CloudConfig
from tests.e2e.moves import (
    SETTLE,
    claimed_on,
    evacuate,
    migrate,
    service_set,
    shown,
    until_record,
    until_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

HOSTS = ("sg-1", "sg-2", "sg-3")
BOOTS = 20


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(
        schedulers=2,
        computes=HOSTS,
        vcpus=32,
        memory_mb=64 * 1024,
        local_gb=1000,
        env=(("KEEL_COMPUTE__RECONCILE_INTERVAL", "1"),),
    )


async def unlimited(http: httpx.AsyncClient) -> None:
    quota = {
        "quota_set": {
            "instances": -1,
            "cores": -1,
            "ram": -1,
            "server_groups": -1,
            "server_group_members": -1,
        }
    }
    answer = await http.put(f"os-quota-sets/{ADMIN['project_id']}", json=quota)
    assert answer.status_code == 200, answer.text


async def anti_affinity_group(http: httpx.AsyncClient, name: str) -> str:
    made = await http.post(
        "os-server-groups",
        json={"server_group": {"name": name, "policy": "anti-affinity"}},
        headers={"OpenStack-API-Version": "compute 2.64"},
    )
    assert made.status_code == 200, made.text
    group: str = made.json()["server_group"]["id"]
    return group


async def boot(http: httpx.AsyncClient, group: str, name: str, **extra: Any) -> str:
    body = {
        "server": {"name": name, "flavorRef": "1", "imageRef": str(CIRROS_ID), **extra},
        "os:scheduler_hints": {"group": group},
    }
    headers = {"OpenStack-API-Version": "compute 2.74"} if "host" in extra else {}
    response = await http.post("servers", json=body, headers=headers)
    assert response.status_code == 202, response.text
    server_id: str = response.json()["server"]["id"]
    return server_id


async def settled(http: httpx.AsyncClient, ids: set[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + SETTLE * 3
    while True:
        listed = (await http.get("servers/detail")).json()["servers"]
        mine = [s for s in listed if s["id"] in ids]
        done = all(s["status"] in ("ACTIVE", "ERROR") for s in mine)
        if (len(mine) == len(ids) and done) or time.monotonic() > deadline:
            return mine
        await asyncio.sleep(1)


async def members_hosts(cloud: Cloud, ids: list[str]) -> list[str]:
    return [(await shown(cloud, server_id))["OS-EXT-SRV-ATTR:host"] for server_id in ids]


async def test_twenty_concurrent_boots_into_one_anti_affinity_group_take_three_hosts(
    cloud: Cloud,
) -> None:
    async with cloud.http(cloud.admin_token) as http:
        await unlimited(http)
        group = await anti_affinity_group(http, "spread")
        ids = await asyncio.gather(*(boot(http, group, f"spread-{i}") for i in range(BOOTS)))
        servers = await settled(http, set(ids))
        for server in servers:
            if server["status"] == "ACTIVE":
                await http.delete(f"servers/{server['id']}")

    assert Counter(s["status"] for s in servers) == {"ACTIVE": 3, "ERROR": BOOTS - 3}
    active = [s for s in servers if s["status"] == "ACTIVE"]
    assert sorted(s["OS-EXT-SRV-ATTR:host"] for s in active) == list(HOSTS)
    for server in servers:
        if server["status"] == "ERROR":
            message = server["fault"]["message"]
            assert "No valid host was found" in message
            assert "server group spread" in message


async def test_the_policy_holds_through_a_migration_and_an_evacuation(cloud: Cloud) -> None:
    async with cloud.http(cloud.admin_token) as http:
        await unlimited(http)
        group = await anti_affinity_group(http, "ha")
        first = await boot(http, group, "ha-1", host="sg-1")
        second = await boot(http, group, "ha-2", host="sg-2")
        for server_id in (first, second):
            await until_server(cloud, server_id, "ACTIVE")

        # sg-1 holds a member: a requested destination there is refused with the reason.
        refused = cloud.openstack_raw(
            "--os-compute-api-version", "2.56", "server", "migrate", "--host", "sg-2", first,
            as_json=False,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "anti-affinity policy of server group ha" in refused.stderr

        # The only host the policy leaves for the first member is sg-3.
        migrate(cloud, first)
        await until_server(cloud, first, "VERIFY_RESIZE")
        cloud.openstack("server", "resize", "confirm", first, as_json=False)
        await until_record(cloud, first, "confirmed")
        assert await members_hosts(cloud, [first, second]) == ["sg-3", "sg-2"]

        # sg-3 dies: the member evacuated from it may only go to sg-1.
        assert cloud.processes["sg-3"].stop() == 0
        service_set(cloud, "sg-3", "--down")
        evacuate(cloud, first)
        await until_record(cloud, first, "done")
        await until_server(cloud, first, "ACTIVE")
        assert await members_hosts(cloud, [first, second]) == ["sg-1", "sg-2"]

        # sg-2 dies too: its member has nowhere left, and the error says why.
        assert cloud.processes["sg-2"].stop() == 0
        service_set(cloud, "sg-2", "--down")
        evacuate(cloud, second)
        failed = await until_server(cloud, second, "ERROR")
        message = failed["fault"]["message"]
        assert f"Instance {second} cannot be placed" in message
        assert f"sg-1: {first}" in message
        assert failed["OS-EXT-SRV-ATTR:host"] == "sg-2"
        assert await claimed_on(cloud, first) == ["sg-1", "sg-3"]
