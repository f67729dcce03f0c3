"""keel-compute on a real RabbitMQ, with a stand-in conductor on topic ``conductor``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.compute.agent import Agent, start_agent
from services.compute.main import serve
from services.compute.rpcapi import ComputeAPI, InstanceSpec
from services.compute.virt import load_driver
from services.compute.virt.local import LocalDriver
from shared.config import ComputeSettings, RpcSettings, Settings
from shared.context import RequestContext
from shared.rpc.amqp import AmqpTransport
from shared.runtime import Lifecycle
from tests.unit.services.compute.standin import (
    StandInConductor,
    eventually,
    make_spec,
    serve_standin,
)

pytestmark = pytest.mark.functional


class SlowLocalDriver(LocalDriver):
    async def spawn(self, spec: InstanceSpec) -> None:
        await asyncio.sleep(0.5)
        await super().spawn(spec)


def _transport(settings: Settings) -> AmqpTransport:
    return AmqpTransport(
        settings.transport_url,
        settings.exchange,
        queue_expires=settings.rpc.queue_expires,
        connect_timeout=settings.rpc.connect_timeout,
    )


@dataclass
class Cloud:
    """A stand-in conductor on its own connection, and a client of the agents."""

    settings: Settings
    conductor: StandInConductor = field(default_factory=StandInConductor)
    transport: AmqpTransport = field(init=False)
    compute: ComputeAPI = field(init=False)

    def __post_init__(self) -> None:
        self.transport = _transport(self.settings)
        self.compute = ComputeAPI(self.transport)

    def guest_dir(self, spec: InstanceSpec) -> Path:
        return self.settings.state_dir / "instances" / str(spec.uuid)

    async def start_conductor(self) -> None:
        await self.transport.connect()
        await serve_standin(self.transport, self.conductor)

    async def start_agent(self, driver: LocalDriver | None = None) -> Agent:
        return await start_agent(
            self.settings, _transport(self.settings), driver or load_driver(self.settings)
        )


@pytest.fixture
def settings(tmp_path: Path, amqp_url: str, exchange: str) -> Settings:
    return Settings(
        host="functional-host",
        state_dir=tmp_path,
        transport_url=amqp_url,
        exchange=exchange,
        report_interval=0.1,
        rpc=RpcSettings(call_timeout=5, connect_timeout=15, queue_expires=60),
        compute=ComputeSettings(drain_timeout=10, vcpus=4, memory_mb=8192, local_gb=80),
    )


@pytest.fixture
async def cloud(settings: Settings) -> AsyncIterator[Cloud]:
    made = Cloud(settings)
    await made.start_conductor()
    yield made
    await made.transport.close()


async def test_start_up_registers_and_heartbeats_arrive(cloud: Cloud) -> None:
    agent = await cloud.start_agent()
    try:
        [registration] = cloud.conductor.registrations
        assert registration.host == "functional-host"
        assert registration.resources.vcpus == 4
        assert (cloud.settings.state_dir / "compute_id").read_text().strip() == str(
            registration.node_uuid
        )
        await eventually(
            lambda: (
                sum(h.service_uuid == agent.service_uuid for h in cloud.conductor.heartbeats) >= 2
            )
        )
        beats = [h for h in cloud.conductor.heartbeats if h.service_uuid == agent.service_uuid]
        # The first carries the node's resources; the next, unchanged, go without them.
        assert beats[0].resources is not None
        assert beats[0].resources.vcpus == 4
        assert beats[1].resources is None
    finally:
        await agent.stop()


async def test_build_and_terminate_casts_reach_the_agent(cloud: Cloud) -> None:
    agent = await cloud.start_agent()
    try:
        spec = make_spec(root_gb=10, node="functional-host")
        await cloud.compute.build_and_run_instance(RequestContext(), agent.service_uuid, spec)
        await eventually(lambda: bool(cloud.conductor.results_for(spec.uuid)))
        assert cloud.conductor.results_for(spec.uuid)[0].success
        assert (cloud.guest_dir(spec) / "disk").stat().st_size == 10 * 1024**3
        assert (cloud.guest_dir(spec) / "metadata.json").is_file()

        await cloud.compute.terminate_instance(RequestContext(), agent.service_uuid, spec.uuid)
        await eventually(lambda: spec.uuid in cloud.conductor.deleted)
        assert not cloud.guest_dir(spec).exists()
    finally:
        await agent.stop()


async def test_stopping_drains_an_in_flight_build(cloud: Cloud) -> None:
    agent = await cloud.start_agent(SlowLocalDriver(cloud.settings.state_dir, "functional-host"))
    spec = make_spec()
    await cloud.compute.build_and_run_instance(RequestContext(), agent.service_uuid, spec)
    await eventually(lambda: bool(agent.manager.in_flight()))

    await agent.stop()

    assert (cloud.guest_dir(spec) / "metadata.json").is_file()
    await eventually(lambda: bool(cloud.conductor.results_for(spec.uuid)))
    assert [r.success for r in cloud.conductor.results_for(spec.uuid)] == [True]


async def test_agent_waits_for_a_conductor_that_starts_late(settings: Settings) -> None:
    cloud = Cloud(settings)
    starting = asyncio.create_task(cloud.start_agent())
    await asyncio.sleep(0.5)
    assert not starting.done()

    await cloud.start_conductor()
    agent = await starting
    try:
        assert [r.node_uuid for r in cloud.conductor.registrations] == [
            agent.registration.node_uuid
        ]
    finally:
        await agent.stop()
        await cloud.transport.close()


async def test_service_main_serves_until_stopped(cloud: Cloud) -> None:
    lifecycle = Lifecycle()
    running = asyncio.create_task(serve(cloud.settings, lifecycle))
    await eventually(lambda: bool(cloud.conductor.heartbeats))
    service_uuid = cloud.conductor.heartbeats[0].service_uuid

    spec = make_spec()
    await cloud.compute.build_and_run_instance(RequestContext(), service_uuid, spec)
    await eventually(lambda: bool(cloud.conductor.results_for(spec.uuid)))
    assert cloud.guest_dir(spec).is_dir()

    lifecycle.stopping.set()
    async with asyncio.timeout(30):
        await running


async def test_service_main_stops_while_waiting_for_the_conductor(settings: Settings) -> None:
    lifecycle = Lifecycle()
    running = asyncio.create_task(serve(settings, lifecycle))
    await asyncio.sleep(0.3)

    lifecycle.stopping.set()
    async with asyncio.timeout(30):
        await running

    # No conductor ever said what the database knows about this host: nothing is written.
    assert not (settings.state_dir / "compute_id").exists()
