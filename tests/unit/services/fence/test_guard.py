"""The host fence (keel-fence's core), on a clock the test moves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from services.compute.virt.fake import FakeDriver
from services.fence.api import FENCED_FILE, Lease, MemoryLeaseStore
from services.fence.guard import HostFence
from tests.unit.services.compute.standin import make_spec

LEASE = 8.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Host:
    """A fake hypervisor, its lease and its fence (record in ``state_dir``)."""

    def __init__(self, state_dir: Path) -> None:
        self.clock = Clock()
        self.driver = FakeDriver("host1")
        self.store = MemoryLeaseStore(clock=self.clock, boot="boot-1")
        self.store.agent_running = True
        self.state_dir = state_dir
        self.pets = 0
        self.fence = self.new_fence()

    def new_fence(self) -> HostFence:
        return HostFence(self.driver, self.store, record_dir=self.state_dir, watchdog=self.pet)

    def pet(self) -> None:
        self.pets += 1

    async def renew(self, *, reconciled_at: float | None = None, boot: str = "boot-1") -> None:
        """An answered heartbeat sent now: the agent's lease runs LEASE seconds from now."""
        await self.store.write_lease(
            Lease(
                boot=boot,
                length=LEASE,
                expires_at=self.clock.now + LEASE,
                reconciled_at=reconciled_at,
            )
        )

    async def guests(self, count: int) -> list[UUID]:
        specs = [make_spec() for _ in range(count)]
        for spec in specs:
            await self.driver.spawn(spec)
        return [spec.uuid for spec in specs]

    async def running(self) -> set[UUID]:
        return {
            g
            for g in await self.driver.list_instances()
            if (await self.driver.guest_power(g)).name == "RUNNING"
        }

    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / FENCED_FILE).read_text())
        return data


def state_of(fence: HostFence) -> str:
    """The fence's state now (a call: each look may change it)."""
    return fence.state


@pytest.fixture
async def host(tmp_path: Path) -> Host:
    made = Host(tmp_path)
    await made.renew()
    return made


async def test_a_lease_that_runs_guards_and_fences_nothing(host: Host) -> None:
    guests = await host.guests(2)
    host.clock.now += LEASE - 0.1

    assert await host.fence.tick()

    assert await host.running() == set(guests)
    assert state_of(host.fence) == "armed"
    assert host.store.status is not None
    assert host.store.status.state == "armed"
    assert not (host.state_dir / FENCED_FILE).exists()


async def test_past_the_lease_every_running_guest_is_powered_off_and_kept(host: Host) -> None:
    guests = await host.guests(3)
    host.clock.now += LEASE

    assert await host.fence.tick()

    assert await host.running() == set()
    assert set(await host.driver.list_instances()) == set(guests), "never destroyed"
    record = host.record()
    assert sorted(record["powered_off"]) == sorted(str(g) for g in guests)
    assert record["silent_for"] == pytest.approx(LEASE)
    assert record["boot"] == "boot-1"
    assert host.store.status is not None
    assert (host.store.status.state, host.store.status.fires) == ("fired", 1)


async def test_firing_twice_at_once_fires_once_and_keeps_guests_off(host: Host) -> None:
    await host.guests(2)
    host.clock.now += LEASE + 1

    await asyncio.gather(host.fence.tick(), host.fence.tick())
    late = await host.guests(1)  # a guest something started while the host was fenced
    await host.fence.tick()

    assert host.fence.fires == 1
    assert await host.running() == set()
    assert late[0] in await host.driver.list_instances()


async def test_a_paused_or_suspended_guest_is_left_as_it_is(host: Host) -> None:
    """Neither runs; powering off a suspended guest would lose the memory it saved."""
    running, paused, suspended = await host.guests(3)
    await host.driver.pause(paused)
    await host.driver.suspend(suspended)
    host.clock.now += LEASE

    await host.fence.tick()

    assert host.record()["powered_off"] == [str(running)]
    assert (await host.driver.guest_power(suspended)).name == "SUSPENDED"
    assert (await host.driver.guest_power(paused)).name == "PAUSED"


async def test_a_renewal_alone_lifts_nothing_a_reconcile_after_the_fencing_does(
    host: Host,
) -> None:
    await host.guests(1)
    fired_at = host.clock.now + LEASE
    host.clock.now = fired_at
    await host.fence.tick()

    host.clock.now += 5
    await host.renew()  # contact is back: a heartbeat was answered
    await host.fence.tick()
    assert state_of(host.fence) == "fired", "not reconciled yet"

    await host.renew(reconciled_at=fired_at - 1)  # a report begun before the fencing
    await host.fence.tick()
    assert state_of(host.fence) == "fired"

    await host.renew(reconciled_at=host.clock.now)
    await host.fence.tick()
    assert state_of(host.fence) == "armed"
    assert not (host.state_dir / FENCED_FILE).exists()
    assert await host.running() == set(), "fenced guests stay off until someone starts them"


async def test_a_reconcile_with_a_lease_run_out_lifts_nothing(host: Host) -> None:
    await host.guests(1)
    host.clock.now += LEASE
    await host.fence.tick()

    await host.store.write_lease(
        Lease(boot="boot-1", length=LEASE, expires_at=host.clock.now, reconciled_at=host.clock.now)
    )
    await host.fence.tick()

    assert state_of(host.fence) == "fired"


async def test_without_a_lease_it_guards_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path)  # the agent has not heartbeated yet
    guests = await host.guests(1)
    host.clock.now += 3600

    assert await host.fence.tick()

    assert state_of(host.fence) == "unarmed"
    assert await host.running() == set(guests)


async def test_a_lease_of_an_earlier_boot_guards_nothing(host: Host) -> None:
    await host.renew(boot="boot-0")
    guests = await host.guests(1)
    host.clock.now += 3600

    await host.fence.tick()

    assert state_of(host.fence) == "unarmed"
    assert await host.running() == set(guests)


async def test_a_fencing_recorded_before_the_fence_started_holds_until_a_reconcile(
    host: Host,
) -> None:
    await host.guests(1)
    host.clock.now += LEASE
    await host.fence.tick()

    restarted = host.new_fence()  # the fence process was killed and started again
    assert state_of(restarted) == "fired"
    await host.renew()
    started = await host.guests(1)
    await restarted.tick()
    assert started[0] not in await host.running(), "still fenced: kept off"

    await host.renew(reconciled_at=host.clock.now)
    await restarted.tick()
    assert state_of(restarted) == "armed"


async def test_it_exits_once_the_agent_released_the_lease(host: Host) -> None:
    await host.store.write_lease(
        Lease(boot="boot-1", length=LEASE, expires_at=host.clock.now + LEASE, released=True)
    )

    assert not await host.fence.tick()
    assert state_of(host.fence) == "released"


async def test_it_stays_while_guests_run_and_exits_once_they_are_off(host: Host) -> None:
    """The agent died: the fence guards the guests, fires, then has nothing to guard."""
    await host.guests(1)
    host.store.agent_running = False

    assert await host.fence.tick(), "armed: the lease still runs"
    host.clock.now += LEASE
    assert not await host.fence.tick(), "fired, guests off, no agent: nothing to guard"
    assert await host.running() == set()


async def test_a_fired_fence_stays_while_an_agent_holds_the_host(host: Host) -> None:
    await host.guests(1)
    host.clock.now += LEASE

    assert await host.fence.tick()
    assert await host.fence.tick()


async def test_it_exits_when_the_state_directory_is_gone(tmp_path: Path) -> None:
    state_dir = tmp_path / "host"
    state_dir.mkdir()
    host = Host(state_dir)

    class GoneStore(MemoryLeaseStore):
        def gone(self) -> bool:
            return not state_dir.exists()

    store = GoneStore(clock=host.clock, boot="boot-1")
    store.agent_running = True
    fence = HostFence(host.driver, store, record_dir=state_dir)
    assert await fence.tick()
    state_dir.rmdir()

    assert not await fence.tick()


async def test_the_watchdog_is_petted_at_every_look(host: Host) -> None:
    for _ in range(3):
        await host.fence.tick()

    assert host.pets == 3
    assert host.store.status is not None
    assert host.store.status.watchdog


async def test_it_wakes_when_the_lease_is_written(host: Host) -> None:
    """Between two looks it waits for its tick, or for the lease to change."""
    guests = await host.guests(1)
    stopping = asyncio.Event()
    running = asyncio.create_task(host.fence.run(stopping, interval=None))
    await asyncio.sleep(0.01)
    host.clock.now += LEASE  # the lease ran out, but nothing woke the fence

    assert await host.running() == set(guests)
    await host.store.write_lease(Lease(boot="boot-1", length=LEASE, expires_at=host.clock.now - 1))
    async with asyncio.timeout(5):
        while await host.running():  # noqa: ASYNC110 (the driver has no event to wait on)
            await asyncio.sleep(0.01)

    stopping.set()
    host.store.changed().set()
    await asyncio.wait_for(running, 1)
