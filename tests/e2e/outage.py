"""What the outage tests share: a proxy in front of a shared server, clients booting
servers across an outage, and the checks that a cloud came through an outage whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from shared.db import allocations
from tests.e2e.cloud import ADMIN, CIRROS_ID, OUTAGE_LEASE, Cloud, CloudConfig
from tests.faults.proxy import TcpProxy
from tests.polling import wait_until


@asynccontextmanager
async def proxy_to(url: str, default_port: int) -> AsyncIterator[TcpProxy]:
    """A running proxy in front of the server ``url`` names."""
    target = urlsplit(url)
    running = TcpProxy(target.hostname or "127.0.0.1", target.port or default_port)
    await running.start()
    try:
        yield running
    finally:
        await running.close()


def boot_cloud(
    hosts: tuple[str, ...],
    *,
    database_address: str | None = None,
    broker_address: str | None = None,
) -> CloudConfig:
    """A cloud for many boots: roomy hosts with the fake driver, every process reaching
    the database or the broker through a proxy's address."""
    return CloudConfig(
        computes=hosts,
        vcpus=64,
        memory_mb=65536,
        local_gb=1000,
        database_address=database_address,
        broker_address=broker_address,
        env=(("KEEL_COMPUTE__DRIVER", "fake"),),
        self_fence_after=OUTAGE_LEASE,
    )


def pids_of(cloud: Cloud) -> dict[str, int]:
    return {name: process.popen.pid for name, process in cloud.processes.items()}


def assert_nothing_restarted(cloud: Cloud, pids: dict[str, int]) -> None:
    """Each process of ``pids`` still runs, as the same process."""
    for name, pid in pids.items():
        process = cloud.processes[name]
        assert process.popen.poll() is None, f"{name} exited:\n{process.tail()}"
        assert process.popen.pid == pid


def assert_no_tracebacks(cloud: Cloud, tail: int = 3000) -> None:
    tracebacks = [name for name, text in cloud.logs().items() if "Traceback" in text]
    assert tracebacks == [], "\n".join(cloud.logs()[name][-tail:] for name in tracebacks)


async def assert_settled_whole(cloud: Cloud, accepted: list[str], timeout: float) -> None:
    """Every accepted server ends ACTIVE or ERROR within ``timeout``, with at most one
    claim each; usage adds up; no other server exists. A create answered 503 may have
    been recorded all the same (its commit reached the database, the answer did not):
    keel-api withdraws such a server once the database answers again."""

    async def settled() -> bool:
        async with cloud.pool.acquire() as conn:
            building: int = await conn.fetchval(
                "SELECT count(*) FROM instances WHERE uuid = ANY($1::uuid[])"
                " AND vm_state = 'building'",
                accepted,
            )
            others: int = await conn.fetchval(
                "SELECT count(*) FROM instances WHERE deleted_at IS NULL"
                " AND NOT (uuid = ANY($1::uuid[]))",
                accepted,
            )
        return building == 0 and others == 0

    await wait_until(settled, what="every accepted server settling", timeout=timeout)
    async with cloud.pool.acquire() as conn:
        states = await conn.fetch(
            "SELECT vm_state, count(*) FROM instances WHERE uuid = ANY($1::uuid[])"
            " GROUP BY vm_state",
            accepted,
        )
        doubled = await conn.fetch(
            "SELECT instance_uuid FROM allocations GROUP BY instance_uuid HAVING count(*) > 1"
        )
        leftover = await conn.fetch(
            "SELECT vm_state, task_state FROM instances WHERE deleted_at IS NULL"
            " AND NOT (uuid = ANY($1::uuid[]))",
            accepted,
        )
        assert await allocations.usage_drift(conn) == []
    by_state = {row["vm_state"]: row["count"] for row in states}
    assert set(by_state) <= {"active", "error"}, by_state
    assert sum(by_state.values()) == len(accepted)
    assert doubled == []
    assert leftover == [], "a refused create left a server behind"


async def unlimited_quota(cloud: Cloud) -> None:
    """The admin project may create as many servers as the test needs."""
    unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
    async with cloud.http(cloud.admin_token) as http:
        (await http.put(f"os-quota-sets/{ADMIN['project_id']}", json=unlimited)).raise_for_status()


async def cut_when(proxy: TcpProxy, ready: Callable[[], bool], seconds: float) -> None:
    """Once ``ready()`` holds, cut the proxy for ``seconds``, then restore it."""

    async def check() -> bool:
        return ready()

    await wait_until(check, what="the moment to cut", timeout=120)
    await proxy.cut()
    await asyncio.sleep(seconds)
    await proxy.restore()


@dataclass(frozen=True)
class Boot:
    """One create's answer: its status code (0: none came), the server id when it was
    accepted, and the body."""

    code: int
    server_id: str | None
    body: dict[str, Any]


async def boot(http: httpx.AsyncClient, name: str) -> Boot:
    """One create of an m1.tiny cirros server."""
    body = {"server": {"name": name, "imageRef": str(CIRROS_ID), "flavorRef": "1"}}
    try:
        response = await http.post("servers", json=body)
    except httpx.HTTPError:
        return Boot(0, None, {})
    answer: dict[str, Any] = response.json()
    if response.status_code == 202:
        return Boot(202, str(answer["server"]["id"]), answer)
    return Boot(response.status_code, None, answer)


async def boots_across_an_outage(
    cloud: Cloud,
    proxy: TcpProxy,
    *,
    prefix: str,
    boots: int,
    clients: int,
    outage: float,
    retry_after: float | None = None,
) -> list[Boot]:
    """``clients`` clients create ``boots`` servers between them as the admin; once a
    quarter of the creates are answered, ``proxy`` is cut for ``outage`` seconds.

    With ``retry_after``, a create answered 503 is tried again after that pause (every
    answer is kept); without it, each server is asked for once.
    """
    pending = iter(range(boots))
    results: list[Boot] = []

    async def client() -> None:
        async with cloud.http(cloud.admin_token) as http:
            for index in pending:
                while True:
                    results.append(await boot(http, f"{prefix}-{index}"))
                    if retry_after is None or results[-1].code != 503:
                        break
                    await asyncio.sleep(retry_after)

    def quarter_done() -> bool:
        return len(results) >= boots // 4

    await asyncio.gather(cut_when(proxy, quarter_done, outage), *(client() for _ in range(clients)))
    return results
