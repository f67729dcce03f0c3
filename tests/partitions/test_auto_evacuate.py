"""Automatic evacuation (``KEEL_RECOVERY__AUTO_EVACUATE=tagged``) with five agents cut off
for real: a lost host's tagged servers come back elsewhere; a lost zone stays put."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.e2e.cloud import Cloud, CloudConfig
from tests.partitions.harness import (
    DOWN_TIME,
    EVACUABLE_AFTER,
    FENCE_AFTER,
    SETTLE,
    Hosts,
    Sampler,
    config,
    guest_states,
    records_of,
    set_metadata,
    until_server,
)
from tests.polling import wait_until

pytestmark = [pytest.mark.partitions, pytest.mark.timeout(900)]

HOSTS = tuple(f"ha-{i}" for i in range(1, 6))
TAGGED = {"HA_Enabled": "True"}


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return config(("KEEL_RECOVERY__AUTO_EVACUATE", "tagged"))


@pytest.fixture(scope="module")
async def agents(hosts: Hosts) -> Hosts:
    await hosts.start_all(HOSTS)
    return hosts


@pytest.fixture
async def healed(agents: Hosts) -> AsyncIterator[Hosts]:
    yield agents
    agents.heal(*HOSTS)
    for name in HOSTS:
        await agents.until_up(name)


async def server(cloud: Cloud, name: str, host: str, *, tagged: bool) -> str:
    made = await cloud.create_server(name, host=host)
    if tagged:
        await set_metadata(cloud, made["id"], TAGGED)
    return str(made["id"])


async def test_a_lost_hosts_tagged_servers_come_back_elsewhere_and_the_others_stay(
    cloud: Cloud, healed: Hosts
) -> None:
    hosts = healed
    tagged = [await server(cloud, f"ha-t{i}", "ha-1", tagged=True) for i in range(2)]
    untagged = await server(cloud, "ha-u", "ha-1", tagged=False)
    with Sampler(hosts) as sampler:
        hosts.cut("ha-1")
        cut_at = time.monotonic()
        deadline = DOWN_TIME + FENCE_AFTER + 60
        for sid in tagged:
            await until_server(
                cloud,
                sid,
                lambda s: s["status"] == "ACTIVE" and s["OS-EXT-SRV-ATTR:host"] != "ha-1",
                f"{sid} ACTIVE elsewhere",
                timeout=deadline - (time.monotonic() - cut_at),
            )
        assert time.monotonic() - cut_at <= deadline
        assert hosts.fenced("ha-1")
        stayed = await until_server(cloud, untagged, lambda s: True, "shown")
        assert stayed["OS-EXT-SRV-ATTR:host"] == "ha-1"
        assert await records_of(cloud, untagged) == []
        events = await cloud.get(f"servers/{tagged[0]}/os-instance-actions")
        by_system = [a for a in events["instanceActions"] if a["action"] == "evacuate"]
        assert [a["user_id"] for a in by_system] == ["keel-recovery"]

        hosts.heal("ha-1")
        await hosts.until_up("ha-1")

        async def old_copies_gone() -> bool:
            return set(guest_states(hosts.state_dir("ha-1"))) == {untagged}

        await wait_until(old_copies_gone, what="ha-1 removing evacuated copies", timeout=SETTLE)
    assert sampler.doubles == [], sampler.doubles
    assert sampler.states("ha-1", untagged) == ["running", "shutdown"], "fenced, kept"


async def test_three_hosts_of_five_lost_at_once_evacuate_nothing_and_say_why(
    cloud: Cloud, healed: Hosts
) -> None:
    hosts = healed
    lost = ("ha-2", "ha-3", "ha-4")
    tagged = [await server(cloud, f"zone-{h}", h, tagged=True) for h in lost]
    with Sampler(hosts) as sampler:
        hosts.cut(*lost)
        await asyncio.sleep(EVACUABLE_AFTER + 15)
        for name in lost:
            assert hosts.fenced(name)
        for sid in tagged:
            assert await records_of(cloud, sid) == []
        hosts.heal(*lost)
        for name in lost:
            await hosts.until_up(name)
    assert sampler.doubles == []
    conductor = cloud.processes["conductor"].read_log()
    assert (
        "not evacuating any server automatically in availability zone nova: 3 of its 5 "
        "compute hosts are down"
    ) in conductor
