"""The agent's contact watch and its side of the host fence, on a clock the test moves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.contact import ContactWatch
from services.compute.fence_link import FenceLink
from services.compute.virt.fake import FakeDriver
from services.fence.api import MemoryLeaseStore
from services.fence.guard import HostFence
from shared.metrics import Metrics
from tests.unit.services.compute.standin import make_spec

LEASE = 8.0
LOST_AFTER = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ManualLauncher:
    """Starts a fence that looks only when the test says (:meth:`World.look`)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.world.store.fence_running = True
        self.world.fence = HostFence(self.world.driver, self.world.store, record_dir=None)

    def starting(self) -> bool:
        return False

    def stop(self) -> None:
        pass


class World:
    def __init__(self, state_dir: Path, *, lease: float = LEASE) -> None:
        self.clock = Clock()
        self.driver = FakeDriver("host1")
        self.store = MemoryLeaseStore(clock=self.clock, boot="boot-1")
        self.store.agent_running = True
        self.metrics = Metrics()
        self.fence: HostFence | None = None
        self.launcher = ManualLauncher(self)
        self.link = FenceLink(self.store, self.launcher, length=lease, metrics=self.metrics)
        self.watch = ContactWatch(
            self.link, lost_after=LOST_AFTER, clock=self.clock, self_ticking=False
        )
        self.watch.attach(self.report)
        self.reports: list[float] = []
        #: Reports that fail before one succeeds.
        self.failing_reports = 0

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

    async def beat(self) -> None:
        """A heartbeat sent now is answered."""
        await self.watch.heartbeat_succeeded(self.clock.now)

    async def look(self) -> None:
        """The fence looks at its lease (its tick), if one runs."""
        if self.fence is not None:
            await self.fence.tick()


async def started(world: World) -> World:
    """Start-up: the node is known (the fence starts), the first reconcile, heartbeats."""
    world.link.begin()
    await world.watch.reconciled(world.clock.now)
    world.watch.heartbeats_begin()
    await world.beat()
    await world.look()
    return world


@pytest.fixture
async def world(tmp_path: Path) -> World:
    return await started(World(tmp_path))


async def test_start_up_starts_the_fence_and_the_first_heartbeat_arms_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.link.begin()
    await world.watch.reconciled(world.clock.now)
    world.watch.heartbeats_begin()
    assert world.launcher.starts == 1
    assert not world.watch.serving(), "no lease yet: the fence is not armed"
    assert world.link.advertised() is None

    await world.beat()
    await world.look()

    assert world.watch.serving()
    assert world.link.advertised() == LEASE
    assert world.store.lease is not None
    assert world.store.lease.expires_at == world.clock.now + LEASE


async def test_every_answered_heartbeat_renews_the_lease_from_when_it_was_sent(
    world: World,
) -> None:
    sent = world.clock.now + 3
    world.clock.now = sent + 1.5  # the answer came back 1.5 s after it was sent

    await world.watch.heartbeat_succeeded(sent)

    assert world.store.lease is not None
    assert world.store.lease.expires_at == sent + LEASE


async def test_a_dead_fence_is_started_again_and_nothing_starts_meanwhile(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.store.fence_running = False  # keel-fence was killed
    assert not world.watch.serving()
    assert world.link.advertised() is None, "heartbeats say: no armed fence"

    await world.watch.tick()

    assert world.launcher.starts == 2
    assert "starting it again" in caplog.text
    await world.look()  # the new fence reads the lease its predecessor enforced
    assert world.watch.serving()
    await world.watch.tick()
    assert world.metrics.value("keel_fence_armed") == 1


async def test_a_fired_fence_makes_the_agent_reconcile_then_the_fencing_is_lifted(
    world: World,
) -> None:
    await world.guests(2)
    world.clock.now += LEASE  # no heartbeat answered meanwhile
    await world.look()
    assert world.running() == set()
    await world.watch.tick()
    assert world.metrics.value("keel_self_fences_total") == 1
    assert not world.watch.serving()

    world.clock.now += 5
    await world.beat()  # contact is back
    await world.look()
    assert not world.watch.serving(), "not before a reconcile begun after contact"
    await world.watch.tick()  # the watch reconciles now

    assert world.reports == [world.clock.now]
    await world.look()
    assert world.fence is not None
    assert world.fence.state == "armed"
    assert world.watch.serving()
    assert world.running() == set(), "fenced guests stay off until someone starts them"


async def test_fencing_off_needs_no_fence_and_writes_no_lease(tmp_path: Path) -> None:
    world = await started(World(tmp_path, lease=0))

    assert world.watch.serving()
    assert world.launcher.starts == 0
    assert world.store.lease is None
    assert world.link.advertised() is None


async def test_a_clean_stop_releases_the_lease_only_with_no_guest_running(world: World) -> None:
    await world.link.release(guests_running=True)
    assert world.store.lease is not None
    assert not world.store.lease.released

    await world.link.release(guests_running=False)
    assert world.store.lease is not None
    assert world.store.lease.released
    assert world.fence is not None
    assert not await world.fence.tick(), "the fence exits"


async def test_a_report_begun_before_the_loss_does_not_count(world: World) -> None:
    began = world.clock.now
    world.clock.now += LOST_AFTER + 0.5
    assert not world.watch.serving()

    await world.watch.reconciled(began)

    assert not world.watch.serving()


async def test_a_short_silence_needs_no_reconcile(world: World) -> None:
    world.clock.now += LOST_AFTER - 0.1
    await world.beat()

    assert world.watch.serving()
    await world.watch.tick()
    assert world.reports == []


async def test_a_gap_no_one_saw_is_caught_by_the_next_heartbeat(world: World) -> None:
    """The event loop was busy through the whole silence: the next answer reveals it."""
    world.clock.now += LOST_AFTER + 1
    await world.beat()

    assert not world.watch.serving()
    await world.watch.tick()
    assert world.watch.serving()


async def test_a_report_that_fails_once_is_tried_again(world: World) -> None:
    world.clock.now += LOST_AFTER + 1
    await world.beat()
    world.failing_reports = 1

    await world.watch.tick()
    assert not world.watch.serving()
    await world.watch.tick()  # backing off: too early
    assert len(world.reports) == 1

    world.clock.now += 11
    await world.beat()
    await world.look()
    await world.watch.tick()
    assert world.watch.serving()
    assert len(world.reports) == 2


async def test_no_reconcile_while_contact_is_still_lost(world: World) -> None:
    world.clock.now += LOST_AFTER + 1

    await world.watch.tick()

    assert world.reports == []
    assert not world.watch.serving()


async def test_waiting_to_serve_ends_with_the_reconcile(world: World) -> None:
    world.clock.now += LOST_AFTER + 1
    waiting = asyncio.create_task(world.watch.wait_serving("build", make_spec().uuid))
    await asyncio.sleep(0.05)
    assert not waiting.done()

    await world.beat()
    await world.watch.reconciled(world.clock.now)

    await asyncio.wait_for(waiting, 2)


async def test_a_report_answered_while_heartbeats_are_not_lifts_nothing(world: World) -> None:
    """The database sees heartbeats, not reports: a host it may evacuate stays fenced."""
    await world.guests(1)
    world.clock.now += LEASE + 1
    await world.look()

    await world.watch.reconciled(world.clock.now)
    await world.watch.tick()

    assert world.fence is not None
    assert world.fence.state == "fired"
    assert not world.watch.serving()
    assert world.reports == [], "no report while heartbeats go unanswered"


async def test_a_lost_broker_connection_however_short_needs_a_reconcile(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The consumer comes back by itself: what it delivers then waits for the report."""
    world.watch.contact_lost("the broker connection was lost (reset by peer)")
    assert "reset by peer" in caplog.text
    await world.beat()  # heartbeats never stopped: the connection came back at once
    assert not world.watch.serving()

    await world.watch.tick()

    assert world.reports == [world.clock.now]
    assert world.watch.serving()
