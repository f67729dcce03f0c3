"""Self-fencing and the reconcile after a reconnection, on a clock the test moves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.fencing import FENCED_FILE, Fencing
from services.compute.virt.fake import FakeDriver
from shared.metrics import Metrics
from tests.unit.services.compute.standin import make_spec

FENCE_AFTER = 8.0
LOST_AFTER = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(self, state_dir: Path, *, fence_after: float = FENCE_AFTER) -> None:
        self.clock = Clock()
        self.driver = FakeDriver("host1")
        self.metrics = Metrics()
        self.state_dir = state_dir
        self.reports: list[float] = []
        #: Reports that fail before one succeeds.
        self.failing_reports = 0
        self.fencing = self.new(fence_after)

    def new(self, fence_after: float = FENCE_AFTER) -> Fencing:
        fencing = Fencing(
            self.driver,
            self.state_dir,
            fence_after=fence_after,
            lost_after=LOST_AFTER,
            metrics=self.metrics,
            clock=self.clock,
        )
        fencing.attach(self.report)
        return fencing

    async def report(self) -> None:
        self.reports.append(self.clock.now)
        if self.failing_reports:
            self.failing_reports -= 1
            raise ConnectionError("the conductor did not answer")

    async def guests(self, count: int) -> list[UUID]:
        specs = [make_spec() for _ in range(count)]
        for spec in specs:
            await self.driver.spawn(spec)
        return [spec.uuid for spec in specs]

    def running(self) -> set[UUID]:
        return {g for g in list(self.driver._guests) if self.driver.is_running(g)}

    def beat(self) -> None:
        """A heartbeat sent now is answered."""
        self.fencing.heartbeat_succeeded(self.clock.now)

    def fences(self) -> float:
        return self.metrics.value("keel_self_fences_total")


@pytest.fixture
async def world(tmp_path: Path) -> World:
    started = World(tmp_path)
    started.fencing.reconciled(started.clock.now)  # start-up's first reconcile
    started.fencing.heartbeats_begin()
    return started


async def test_silence_shorter_than_the_window_fences_nothing(world: World) -> None:
    guests = await world.guests(2)
    world.clock.now += FENCE_AFTER - 0.1

    await world.fencing.tick()

    assert world.running() == set(guests)
    assert not (world.state_dir / FENCED_FILE).exists()
    assert world.fences() == 0
    assert not world.fencing.fenced


async def test_past_the_window_every_guest_is_powered_off_and_kept(world: World) -> None:
    guests = await world.guests(3)
    world.clock.now += FENCE_AFTER

    await world.fencing.tick()

    assert world.running() == set()
    assert set(await world.driver.list_instances()) == set(guests)
    record = json.loads((world.state_dir / FENCED_FILE).read_text())
    assert sorted(record["powered_off"]) == sorted(str(g) for g in guests)
    assert record["self_fence_after"] == FENCE_AFTER
    assert record["silent_for"] == pytest.approx(FENCE_AFTER)
    assert world.fences() == 1
    assert not world.fencing.serving()


async def test_fencing_twice_at_once_fences_once_and_keeps_guests_off(world: World) -> None:
    await world.guests(2)
    world.clock.now += FENCE_AFTER + 1

    await asyncio.gather(world.fencing.tick(), world.fencing.tick())
    late = await world.guests(1)  # a build that finished while the host was fenced
    await world.fencing.tick()

    assert world.fences() == 1
    assert world.running() == set()
    assert late[0] in await world.driver.list_instances()


async def test_self_fencing_off_never_powers_anything_off(tmp_path: Path) -> None:
    world = World(tmp_path, fence_after=0)
    guests = await world.guests(1)
    world.clock.now += 3600

    await world.fencing.tick()

    assert world.running() == set(guests)
    assert not world.fencing.fenced


async def test_after_a_fence_nothing_is_served_before_a_reconcile_begun_after_contact(
    world: World,
) -> None:
    await world.guests(2)
    world.clock.now += FENCE_AFTER
    await world.fencing.tick()

    world.clock.now += 5
    world.beat()  # contact is back
    assert not world.fencing.serving()
    await world.fencing.tick()  # the watchdog reconciles now

    assert world.reports == [world.clock.now]
    assert world.fencing.serving()
    assert not (world.state_dir / FENCED_FILE).exists()
    assert not world.fencing.fenced
    assert world.running() == set(), "fenced guests stay off until someone starts them"


async def test_a_report_begun_before_the_loss_does_not_count(world: World) -> None:
    began = world.clock.now
    world.clock.now += LOST_AFTER + 0.5
    assert not world.fencing.serving()

    world.fencing.reconciled(began)

    assert not world.fencing.serving()


async def test_a_short_silence_needs_no_reconcile(world: World) -> None:
    world.clock.now += LOST_AFTER - 0.1
    world.beat()

    assert world.fencing.serving()
    await world.fencing.tick()
    assert world.reports == []


async def test_a_gap_no_one_saw_is_caught_by_the_next_heartbeat(world: World) -> None:
    """The event loop was busy through the whole silence: the next answer reveals it."""
    world.clock.now += LOST_AFTER + 1
    world.beat()

    assert not world.fencing.serving()
    await world.fencing.tick()
    assert world.fencing.serving()


async def test_a_report_that_fails_once_is_tried_again(world: World) -> None:
    world.clock.now += LOST_AFTER + 1
    world.beat()
    world.failing_reports = 1

    await world.fencing.tick()
    assert not world.fencing.serving()
    await world.fencing.tick()  # backing off: too early
    assert len(world.reports) == 1

    world.clock.now += 11
    world.beat()
    await world.fencing.tick()
    assert world.fencing.serving()
    assert len(world.reports) == 2


async def test_no_reconcile_while_contact_is_still_lost(world: World) -> None:
    world.clock.now += LOST_AFTER + 1

    await world.fencing.tick()

    assert world.reports == []
    assert not world.fencing.serving()


async def test_a_fencing_survives_a_restart_until_the_first_reconcile(world: World) -> None:
    await world.guests(1)
    world.clock.now += FENCE_AFTER
    await world.fencing.tick()

    restarted = world.new()
    assert restarted.fenced
    assert not restarted.serving()
    restarted.reconciled(world.clock.now)
    restarted.heartbeats_begin()

    assert restarted.serving()
    assert not (world.state_dir / FENCED_FILE).exists()


async def test_waiting_to_serve_ends_with_the_reconcile(world: World) -> None:
    world.clock.now += LOST_AFTER + 1
    waiting = asyncio.create_task(world.fencing.wait_serving("build", make_spec().uuid))
    await asyncio.sleep(0.05)
    assert not waiting.done()

    world.beat()
    world.fencing.reconciled(world.clock.now)

    await asyncio.wait_for(waiting, 2)


async def test_a_paused_or_suspended_guest_is_left_as_it_is(world: World) -> None:
    """Neither runs; powering off a suspended guest would lose the memory it saved."""
    running, paused, suspended = await world.guests(3)
    await world.driver.pause(paused)
    await world.driver.suspend(suspended)
    world.clock.now += FENCE_AFTER

    await world.fencing.tick()

    assert world.running() == set()
    record = json.loads((world.state_dir / FENCED_FILE).read_text())
    assert record["powered_off"] == [str(running)]
    assert (await world.driver.guest_power(suspended)).name == "SUSPENDED"
    assert (await world.driver.guest_power(paused)).name == "PAUSED"


async def test_a_report_answered_while_heartbeats_are_not_lifts_nothing(world: World) -> None:
    """The database sees heartbeats, not reports: a host it may evacuate stays fenced."""
    await world.guests(1)
    world.clock.now += FENCE_AFTER + 1
    await world.fencing.tick()

    world.fencing.reconciled(world.clock.now)
    await world.fencing.tick()

    assert world.fencing.fenced
    assert not world.fencing.serving()
    assert world.reports == [], "no report while heartbeats go unanswered"


async def test_a_lost_broker_connection_however_short_needs_a_reconcile(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The consumer comes back by itself: what it delivers then waits for the report."""
    world.fencing.contact_lost("the broker connection was lost (reset by peer)")
    assert "reset by peer" in caplog.text
    world.beat()  # heartbeats never stopped: the connection came back at once
    assert not world.fencing.serving()

    await world.fencing.tick()

    assert world.reports == [world.clock.now]
    assert world.fencing.serving()
    assert not world.fencing.fenced
