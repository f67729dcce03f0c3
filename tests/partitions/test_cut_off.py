"""Agents cut off for real: fenced before anyone may evacuate them, never two copies running.

Three hosts of their own (network and UTS namespaces); the middle of each test takes one
host's link down (``ip link set ... down``: packets vanish, as in a real cut) and brings
it back. A sampler reads every agent's guests every half second throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from shared.db import allocations
from tests.e2e.cloud import Cloud
from tests.partitions.harness import (
    DOWN_TIME,
    EVACUABLE_AFTER,
    FENCE_AFTER,
    SETTLE,
    Hosts,
    Sampler,
    evacuate,
    guest_states,
    records_of,
    until_server,
)
from tests.polling import wait_until

pytestmark = [pytest.mark.partitions, pytest.mark.timeout(600)]

HOSTS = ("p-a", "p-b", "p-c")


@pytest.fixture(scope="module")
async def agents(hosts: Hosts) -> Hosts:
    await hosts.start_all(HOSTS)
    return hosts


@pytest.fixture
async def healed(agents: Hosts) -> AsyncIterator[Hosts]:
    """Every link up and every agent up again after the test."""
    yield agents
    agents.heal(*HOSTS)
    for name in HOSTS:
        if agents.cloud.processes[name].exit_code() is not None:
            agents.start(name)
    for name in HOSTS:
        await agents.until_up(name)


async def servers_on(cloud: Cloud, host: str, count: int, prefix: str) -> list[str]:
    made = [await cloud.create_server(f"{prefix}-{i}", host=host) for i in range(count)]
    assert all(s["OS-EXT-SRV-ATTR:host"] == host for s in made)
    return [s["id"] for s in made]


async def no_drift(cloud: Cloud) -> None:
    async with cloud.pool.acquire() as conn:
        assert await allocations.usage_drift(conn) == []


async def test_a_host_cut_off_past_its_window_is_fenced_before_it_may_be_evacuated(
    cloud: Cloud, healed: Hosts
) -> None:
    hosts = healed
    servers = await servers_on(cloud, "p-a", 2, "cut")
    with Sampler(hosts) as sampler:
        hosts.cut("p-a")
        cut_at = time.monotonic()
        refusals: list[str] = []
        while True:
            status, message = await evacuate(cloud, servers[0])
            if status == 200:
                break
            assert status == 400, message
            refusals.append(message)
            assert time.monotonic() - cut_at < EVACUABLE_AFTER + SETTLE, refusals[-3:]
            await asyncio.sleep(0.5)
        allowed_after = time.monotonic() - cut_at
        # Before keel let anyone evacuate, the host had fenced itself: its guests off.
        assert hosts.fenced("p-a")
        assert set(guest_states(hosts.state_dir("p-a")).values()) == {"shutdown"}
        assert allowed_after >= FENCE_AFTER
        assert any("s from now" in m for m in refusals), refusals[-3:]
        assert (await evacuate(cloud, servers[1]))[0] == 200

        moved = {}
        for server in servers:
            shown = await until_server(
                cloud,
                server,
                lambda s: s["status"] == "ACTIVE" and s["OS-EXT-SRV-ATTR:host"] != "p-a",
                f"{server} ACTIVE elsewhere",
            )
            moved[server] = shown["OS-EXT-SRV-ATTR:host"]
            assert guest_states(hosts.state_dir(moved[server]))[server] == "running"

        hosts.heal("p-a")
        await hosts.until_up("p-a")

        async def cleaned() -> bool:
            left = guest_states(hosts.state_dir("p-a"))
            done = [(await records_of(cloud, s))[0]["status"] for s in servers]
            return not left and done == ["completed"] * len(servers)

        await wait_until(cleaned, what="p-a removing the evacuated copies", timeout=SETTLE)

        async def lifted() -> bool:
            return not hosts.fenced("p-a")

        # Once a report begun after its heartbeats are answered again has been acted on.
        await wait_until(lifted, what="p-a lifting its fencing", timeout=SETTLE)

    assert sampler.doubles == [], sampler.doubles
    for server in servers:
        # The old copy was powered off by the fence and never started again.
        assert sampler.states("p-a", server) == ["running", "shutdown"]
        assert "running" in sampler.states(moved[server], server)
    log = hosts.log("p-a")
    # The host's fence (its output goes to the agent's log) fired before the agent, back
    # in contact, reconciled and served again.
    assert "fenced: the lease ran out" in log
    assert log.index("fenced: the lease ran out") < log.index(
        "after contact with the control plane came back"
    )
    await no_drift(cloud)


async def test_a_cut_shorter_than_the_window_fences_moves_and_stops_nothing(
    cloud: Cloud, healed: Hosts
) -> None:
    hosts = healed
    servers = await servers_on(cloud, "p-b", 2, "blip")
    with Sampler(hosts) as sampler:
        hosts.cut("p-b")
        await hosts.until_up("p-b", up=False, timeout=DOWN_TIME + 30)
        status, message = await evacuate(cloud, servers[0])
        assert status == 400
        assert "not yet fenced" in message
        await asyncio.sleep(max(0.0, FENCE_AFTER - DOWN_TIME - 3))
        hosts.heal("p-b")
        await hosts.until_up("p-b")
        await asyncio.sleep(3)  # the agent's reconcile after reconnecting, and a report

    assert not hosts.fenced("p-b")
    for server in servers:
        assert sampler.states("p-b", server) == ["running"], sampler.states("p-b", server)
        assert await records_of(cloud, server) == []
        shown = await until_server(cloud, server, lambda s: s["status"] == "ACTIVE", "active")
        assert shown["OS-EXT-SRV-ATTR:host"] == "p-b"
    assert "fenced: the lease ran out" not in hosts.log("p-b")
    assert "contact with the control plane is lost" in hosts.log("p-b")
    await no_drift(cloud)


async def rows_of(cloud: Cloud, prefix: str) -> list[str]:
    """The services and compute nodes rows of hosts named ``prefix``..., as JSON text."""
    async with cloud.pool.acquire() as conn:
        return [
            row[0]
            for table in ("services", "compute_nodes")
            for row in await conn.fetch(
                f"SELECT to_jsonb(t)::text FROM {table} t WHERE host LIKE $1 ORDER BY id",
                prefix + "%",
            )
        ]


async def test_an_agent_whose_kernel_host_name_changed_is_refused_as_a_rename(
    cloud: Cloud, healed: Hosts
) -> None:
    hosts = healed
    assert cloud.processes["p-c"].stop() == 0
    before = await rows_of(cloud, "p-c")
    assert len(before) == 2, "registered under its kernel host name, without KEEL_HOST"
    net = hosts.nets["p-c"]
    hosts.partitions.rename(net, "p-c-renamed")
    try:
        assert hosts.partitions.kernel_hostname(net) == "p-c-renamed"
        restarted = hosts.start("p-c")
        code = await asyncio.to_thread(restarted.popen.wait, 60)
        assert code == 1, restarted.tail()
        log = restarted.read_log()
        assert "Possible rename detected" in log
        assert "but this agent's host is 'p-c-renamed'" in log.replace("\n", " ")
        assert await rows_of(cloud, "p-c") == before, "the refusal changed the database"
    finally:
        hosts.partitions.rename(net, "p-c")
