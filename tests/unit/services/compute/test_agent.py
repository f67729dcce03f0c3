"""Agent start-up and shutdown, on the fake broker with a stand-in conductor."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.compute import agent as agent_module
from services.compute import joining
from services.compute.agent import Agent, start_agent
from services.compute.rpcapi import ComputeAPI, topic_for
from services.compute.virt.fake import FakeDriver
from services.conductor.rpcapi import ComputeResolution
from shared.config import ComputeSettings, FencingSettings, RpcSettings, Settings
from shared.context import RequestContext
from shared.exceptions import (
    ConfigError,
    Conflict,
    HostRenameDetected,
    KeelError,
    MessagingError,
    MessagingTimeout,
    ServiceNotFound,
    ServiceTooOld,
)
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.versions import (
    SELF_FENCING_VERSION,
    SERVICE_VERSION,
    STABLE_IDENTITY_VERSION,
    apis_for,
)
from tests.unit.services.compute.standin import (
    Node,
    StandInConductor,
    eventually,
    make_spec,
    serve_standin,
)


def _settings(state_dir: Path, host: str = "host1", connect_timeout: float = 5.0) -> Settings:
    return Settings(
        host=host,
        state_dir=state_dir,
        report_interval=0.05,
        rpc=RpcSettings(call_timeout=2, connect_timeout=connect_timeout),
        compute=ComputeSettings(driver="fake", drain_timeout=5),
    )


@dataclass
class World:
    broker: FakeBroker
    conductor: StandInConductor
    conductor_side: FakeTransport

    def transport(self) -> FakeTransport:
        return FakeTransport(self.broker)

    async def start(self, settings: Settings, driver: FakeDriver | None = None) -> Agent:
        driver = driver or FakeDriver(settings.host, vcpus=8, memory_mb=4096, local_gb=100)
        return await start_agent(settings, self.transport(), driver)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    broker = FakeBroker()
    conductor_side = FakeTransport(broker)
    await conductor_side.connect()
    standin = StandInConductor()
    await serve_standin(conductor_side, standin)
    yield World(broker, standin, conductor_side)
    await conductor_side.close()


async def test_start_up_creates_identity_registers_and_serves(world: World, tmp_path: Path) -> None:
    agent = await world.start(_settings(tmp_path))
    try:
        [registration] = world.conductor.registrations
        assert registration.host == "host1"
        assert registration.version == SERVICE_VERSION
        assert (tmp_path / "compute_id").read_text().strip() == str(registration.node_uuid)
        assert registration.resources.vcpus == 8
        assert registration.resources.cpu_allocation_ratio == 4.0
        assert registration.resources.availability_zone == "nova"
        assert agent.topic == topic_for(agent.service_uuid)

        spec = make_spec()
        await ComputeAPI(world.conductor_side).build_and_run_instance(
            RequestContext(), agent.service_uuid, spec
        )
        await eventually(lambda: bool(world.conductor.results_for(spec.uuid)))
        assert world.conductor.results_for(spec.uuid)[0].success
    finally:
        await agent.stop()


async def test_restart_keeps_the_node_identity(world: World, tmp_path: Path) -> None:
    for _ in range(2):
        agent = await world.start(_settings(tmp_path))
        await agent.stop()

    first, second = world.conductor.registrations
    assert first.node_uuid == second.node_uuid


async def test_heartbeats_carry_version_and_fresh_resources(world: World, tmp_path: Path) -> None:
    driver = FakeDriver("host1", vcpus=8)
    agent = await world.start(_settings(tmp_path), driver)
    try:
        await driver.spawn(make_spec())
        await eventually(
            lambda: any(
                h.resources is not None and h.resources.running_vms == 1
                for h in world.conductor.heartbeats
            )
        )
        beat = world.conductor.heartbeats[-1]
        assert beat.service_uuid == agent.service_uuid
        assert beat.version == SERVICE_VERSION
        assert beat.node_uuid == agent.registration.node_uuid
    finally:
        await agent.stop()


async def test_heartbeats_carry_resources_when_they_changed_and_every_few_beats(
    world: World, tmp_path: Path
) -> None:
    driver = FakeDriver("host1", vcpus=8)
    agent = await world.start(_settings(tmp_path), driver)
    every = agent_module.RESOURCES_EVERY
    try:
        await eventually(lambda: len(world.conductor.heartbeats) > 2 * every)
        first = world.conductor.heartbeats[: 2 * every + 1]
        carried = [i for i, beat in enumerate(first) if beat.resources is not None]
        assert carried == [0, every, 2 * every]
        assert all(beat.version == SERVICE_VERSION for beat in first)

        # A change goes with the next heartbeat, not a few beats later.
        seen = len(world.conductor.heartbeats)
        await driver.spawn(make_spec())
        await eventually(lambda: len(world.conductor.heartbeats) > seen + 1)
        changed = world.conductor.heartbeats[seen : seen + 2]
        assert any(b.resources is not None and b.resources.running_vms == 1 for b in changed)
    finally:
        await agent.stop()


async def test_registration_waits_for_a_conductor_that_starts_late(tmp_path: Path) -> None:
    broker = FakeBroker()
    starting = asyncio.create_task(
        start_agent(_settings(tmp_path), FakeTransport(broker), FakeDriver("host1"))
    )
    await asyncio.sleep(0.3)
    assert not starting.done()

    late = FakeTransport(broker)
    await late.connect()
    standin = StandInConductor()
    await serve_standin(late, standin)
    agent = await starting
    try:
        assert [r.node_uuid for r in standin.registrations] == [agent.registration.node_uuid]
    finally:
        await agent.stop()
        await late.close()


async def test_registration_gives_up_after_connect_timeout(tmp_path: Path) -> None:
    transport = FakeTransport(FakeBroker())
    settings = _settings(tmp_path, connect_timeout=0.3)

    with pytest.raises(MessagingTimeout, match="no keel-conductor answered") as info:
        await start_agent(settings, transport, FakeDriver("host1"))

    assert "exchange 'keel'" in info.value.message
    with pytest.raises(MessagingError, match="not connected"):
        await transport.cast("conductor", b"{}", message_id="m")


async def test_renamed_host_is_refused_without_retry(world: World, tmp_path: Path) -> None:
    agent = await world.start(_settings(tmp_path, host="old-name"))
    await agent.stop()
    queues_before = set(world.broker.queues)

    with pytest.raises(HostRenameDetected, match="belongs to host 'old-name'"):
        await world.start(_settings(tmp_path, host="new-name"))

    assert [r.host for r in world.conductor.resolutions] == ["old-name", "new-name"]
    assert [r.host for r in world.conductor.registrations] == ["old-name"]
    assert set(world.broker.queues) == queues_before


async def test_corrupt_identity_refuses_before_talking_to_the_conductor(
    world: World, tmp_path: Path
) -> None:
    (tmp_path / "compute_id").write_text("garbage\n")

    with pytest.raises(ConfigError, match="corrupt"):
        await world.start(_settings(tmp_path))

    assert world.conductor.registrations == []
    assert (tmp_path / "compute_id").read_text() == "garbage\n"


async def test_identity_is_written_only_after_the_conductor_resolved_it(
    world: World, tmp_path: Path
) -> None:
    agent = await world.start(_settings(tmp_path))
    await agent.stop()

    [resolution] = world.conductor.resolutions
    assert resolution.node_uuid is None
    assert resolution.identity_file == str(tmp_path / "compute_id")
    assert (tmp_path / "compute_id").read_text() == f"{agent.registration.node_uuid}\n"


async def test_refused_identity_writes_no_file_and_registers_nothing(
    world: World, tmp_path: Path
) -> None:
    known = uuid.uuid4()
    world.conductor.nodes[known] = Node("elsewhere", uuid.uuid4(), 1, 1)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "compute_id").write_text(f"{known}\n")
    settings = _settings(tmp_path / "state")
    settings._config_file = tmp_path / "etc" / "keel.toml"

    with pytest.raises(HostRenameDetected):
        await world.start(settings)

    assert [r.node_uuid for r in world.conductor.resolutions] == [known]
    assert str(tmp_path / "etc" / "compute_id") in world.conductor.resolutions[0].identity_file
    assert world.conductor.registrations == []
    assert not (tmp_path / "state" / "compute_id").exists()


async def test_copy_beside_the_config_file_is_the_identity(world: World, tmp_path: Path) -> None:
    provisioned = uuid.uuid4()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "compute_id").write_text(f"{provisioned}\n")
    settings = _settings(tmp_path / "state")
    settings._config_file = tmp_path / "etc" / "keel.toml"

    agent = await world.start(settings)
    await agent.stop()

    assert agent.registration.node_uuid == provisioned
    assert [r.node_uuid for r in world.conductor.registrations] == [provisioned]
    assert not (tmp_path / "state" / "compute_id").exists()


async def test_upgrade_adopts_the_node_the_conductor_names(world: World, tmp_path: Path) -> None:
    adopted = uuid.uuid4()
    world.conductor.answer_without_file = ComputeResolution(decision="adopt", node_uuid=adopted)

    agent = await world.start(_settings(tmp_path))
    await agent.stop()

    assert agent.registration.node_uuid == adopted
    assert (tmp_path / "compute_id").read_text() == f"{adopted}\n"


async def test_a_conductor_too_old_to_resolve_makes_the_agent_refuse(tmp_path: Path) -> None:
    broker = FakeBroker()
    old_side = FakeTransport(broker)
    await old_side.connect()
    standin = StandInConductor()
    await serve_standin(old_side, standin, version=apis_for(STABLE_IDENTITY_VERSION - 1).conductor)
    try:
        with pytest.raises(ServiceTooOld, match="Upgrade every keel-conductor first"):
            await start_agent(_settings(tmp_path), FakeTransport(broker), FakeDriver("host1"))
    finally:
        await old_side.close()

    assert standin.registrations == []
    assert not (tmp_path / "compute_id").exists()


async def test_an_agent_of_an_older_release_starts_as_that_release_did(
    world: World, tmp_path: Path
) -> None:
    older = STABLE_IDENTITY_VERSION - 1
    agent = await start_agent(
        _settings(tmp_path), world.transport(), FakeDriver("host1"), service_version=older
    )
    await agent.stop()

    assert world.conductor.resolutions == []
    [registration] = world.conductor.registrations
    assert registration.version == older
    assert (tmp_path / "compute_id").read_text() == f"{registration.node_uuid}\n"


async def test_stop_drains_an_in_flight_build(world: World, tmp_path: Path) -> None:
    driver = FakeDriver("host1", spawn_delay=0.2)
    agent = await world.start(_settings(tmp_path), driver)
    spec = make_spec()
    await ComputeAPI(world.conductor_side).build_and_run_instance(
        RequestContext(), agent.service_uuid, spec
    )
    await eventually(lambda: bool(agent.manager.in_flight()))

    await agent.stop()

    assert driver.guest(spec.uuid) == spec
    assert [r.success for r in world.conductor.results_for(spec.uuid)] == [True]
    heartbeats = len(world.conductor.heartbeats)
    await asyncio.sleep(0.15)
    assert len(world.conductor.heartbeats) == heartbeats


async def test_stopped_agent_no_longer_takes_builds(world: World, tmp_path: Path) -> None:
    agent = await world.start(_settings(tmp_path))
    await agent.stop()
    await agent.stop()

    spec = make_spec()
    await ComputeAPI(world.conductor_side).build_and_run_instance(
        RequestContext(), agent.service_uuid, spec
    )
    await asyncio.sleep(0.05)

    assert world.conductor.results_for(spec.uuid) == []


async def test_an_agent_whose_service_was_deleted_stops_with_the_reason(
    world: World, tmp_path: Path
) -> None:
    refusals: list[KeelError] = []
    settings = _settings(tmp_path)
    driver = FakeDriver(settings.host, vcpus=8, memory_mb=4096, local_gb=100)
    agent = await start_agent(settings, world.transport(), driver, on_refused=refusals.append)
    try:
        beats = len(world.conductor.heartbeats)
        await eventually(lambda: len(world.conductor.heartbeats) > beats)
        # Deleted while the agent was cut off from the conductor.
        world.conductor.deleted_services.add(agent.service_uuid)
        await eventually(lambda: bool(refusals))
        [refused] = refusals
        assert isinstance(refused, ServiceNotFound)
        assert f"compute service {agent.service_uuid} of host 'host1' was deleted" in str(refused)
        stopped_at = len(world.conductor.heartbeats)
        await asyncio.sleep(0.3)
        assert len(world.conductor.heartbeats) == stopped_at
    finally:
        await agent.stop()


async def test_the_first_guest_report_is_retried_until_a_conductor_answers(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up only after reconcile: the agent waits (saying why) instead of serving unsettled."""

    monkeypatch.setattr(joining, "RECONCILE_MAX_PAUSE", 0.01)
    attempts: list[int] = []

    async def flaky() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise MessagingTimeout("no conductor yet")

    with caplog.at_level("WARNING"):
        await joining.first_reconcile(flaky)

    assert len(attempts) == 3
    waiting = [r for r in caplog.records if getattr(r, "decision", "") == "reconcile_waiting"]
    assert len(waiting) == 2
    assert "not serving and not reporting up" in waiting[0].getMessage()


async def test_a_refused_first_guest_report_is_not_retried() -> None:

    attempts: list[int] = []

    async def refusing() -> None:
        attempts.append(1)
        raise Conflict("refused")

    with pytest.raises(Conflict):
        await joining.first_reconcile(refusing)
    assert attempts == [1]


def _fencing_settings(state_dir: Path, fence_after: float = 0.5) -> Settings:
    return _settings(state_dir).model_copy(
        update={
            "service_down_time": 1.0,
            "fencing": FencingSettings(self_fence_after=fence_after),
        }
    )


async def test_registration_and_heartbeats_report_the_self_fence_window(
    world: World, tmp_path: Path
) -> None:
    agent = await world.start(_fencing_settings(tmp_path, fence_after=7.5))
    try:
        await eventually(lambda: bool(world.conductor.heartbeats))
        assert world.conductor.registrations[0].self_fence_after == 7.5
        assert world.conductor.heartbeats[-1].self_fence_after == 7.5
    finally:
        await agent.stop()


async def test_an_agent_of_an_older_release_reports_no_fencing(
    world: World, tmp_path: Path
) -> None:
    agent = await start_agent(
        _fencing_settings(tmp_path),
        world.transport(),
        FakeDriver("host1"),
        service_version=SELF_FENCING_VERSION - 1,
    )
    try:
        await eventually(lambda: bool(world.conductor.heartbeats))
        assert world.conductor.registrations[0].self_fence_after is None
        assert world.conductor.heartbeats[-1].self_fence_after is None
    finally:
        await agent.stop()


async def test_a_cut_off_agents_fence_fires_and_it_reconciles_before_it_builds_again(
    world: World, tmp_path: Path
) -> None:
    driver = FakeDriver("host1")
    agent = await world.start(_fencing_settings(tmp_path), driver)
    compute = ComputeAPI(world.conductor_side)
    ctx = RequestContext()
    try:
        first = make_spec()
        await compute.build_and_run_instance(ctx, agent.service_uuid, first)
        await eventually(lambda: bool(world.conductor.results_for(first.uuid)))
        assert driver.is_running(first.uuid)

        world.conductor.answering.clear()  # cut off
        fence = agent.contact.fence
        await eventually(lambda: fence.fired() and not driver.is_running(first.uuid))
        second = make_spec()
        await compute.build_and_run_instance(ctx, agent.service_uuid, second)
        await asyncio.sleep(0.3)
        assert driver.guest(second.uuid) is None

        healed_at = len(world.conductor.answered)
        world.conductor.answering.set()
        await eventually(lambda: bool(world.conductor.results_for(second.uuid)))

        after = world.conductor.answered[healed_at:]
        building = after.index(("check_build", second.uuid))
        assert ("report", None) in after[:building]
        await eventually(lambda: not fence.fired())
        assert driver.guest(first.uuid) is not None, "a fenced guest is kept"
        assert not driver.is_running(first.uuid), "and is not started again"
        assert driver.is_running(second.uuid)
    finally:
        world.conductor.answering.set()
        await agent.stop()


async def test_a_call_that_ignores_its_cancellation_is_abandoned_in_time() -> None:
    """A heartbeat begun while the connection was being lost must not stop the next."""
    release = asyncio.Event()

    async def stubborn() -> str:
        while True:
            try:
                await release.wait()
                return "late"
            except asyncio.CancelledError:
                continue  # as a library that retries after a cancellation would

    began = asyncio.get_running_loop().time()
    with pytest.raises(MessagingTimeout, match=r"heartbeat did not end within 0\.2s"):
        await agent_module.bounded(stubborn(), 0.2, "heartbeat")
    assert asyncio.get_running_loop().time() - began < 1
    release.set()
    assert await agent_module.bounded(asyncio.sleep(0, "fine"), 1, "heartbeat") == "fine"
