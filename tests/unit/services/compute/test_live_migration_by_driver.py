"""Live migration by a driver that moves guests itself (as libvirt's does, compute RPC
1.18): the agent's handlers on the fake broker, each delivered twice at once.

The driver here is the local driver with the receiving side's calls: its "copy" reports
progress and, unless told to abort, shuts the guest off here (as libvirt leaves the
source); the destination's guest is one the test places, paused, as libvirt leaves it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.live_rpc import LiveComputeAPI, LiveTarget
from services.compute.manager import ComputeManager
from services.compute.rpcapi import RPC_VERSION, ComputeAPI, InstanceSpec, topic_for
from services.compute.virt.local import LocalDriver
from services.conductor.live_rpc import SwitchOutcome
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.exceptions import KeelError
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.rpc.server import RPCServer
from tests.unit.services.compute.standin import eventually, make_spec, serve_standin
from tests.unit.services.compute.test_live_migration import LiveConductor, Rig

MARK = ".incoming"


class MovingDriver(LocalDriver):
    driver_name = "moving"

    def __init__(self, state_dir: Path, hostname: str) -> None:
        super().__init__(state_dir, hostname)
        self.copies = 0
        self.prepared = 0
        #: The copy fails (libvirt's error) after its first report.
        self.fail = False

    def incoming_dir(self, instance_uuid: UUID) -> Path:
        """Prepared files (apart: the local driver takes a guest directory for a guest)."""
        return self.state_dir / "incoming" / str(instance_uuid)

    async def prepare_incoming(self, spec: InstanceSpec, migration_uuid: UUID) -> LiveTarget:
        folder = self.incoming_dir(spec.uuid)
        if not folder.exists():
            self.prepared += 1
            folder.mkdir(parents=True)
            (folder / MARK).write_text(str(migration_uuid))
        return LiveTarget(driver="moving", uri="moving://here", address="127.0.0.1",
                          definition=f"<domain>{spec.uuid}</domain>")  # fmt: skip

    async def discard_incoming(self, instance_uuid: UUID, migration_uuid: UUID) -> None:
        mark = self.incoming_dir(instance_uuid) / MARK
        if mark.exists() and mark.read_text() == str(migration_uuid):
            mark.unlink()
            self.incoming_dir(instance_uuid).rmdir()

    async def arrived(self, instance_uuid: UUID) -> None:
        (self.incoming_dir(instance_uuid) / MARK).unlink(missing_ok=True)

    async def migrate_live(
        self,
        instance_uuid: UUID,
        target: LiveTarget,
        report: Callable[[tuple[int, int], tuple[int, int]], Awaitable[bool]],
    ) -> None:
        self.copies += 1
        for done in (0, 50, 100):
            if not await report((100, done), (10, done // 10)):
                raise KeelError("the job was aborted")
            if self.fail:
                raise KeelError("the destination went away")
            await asyncio.sleep(0.05)
        await self.halt(instance_uuid)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    broker = FakeBroker()
    transports = [FakeTransport(broker) for _ in range(3)]
    for transport in transports:
        await transport.connect()
    conductor_side, agent_side, caller_side = transports
    standin = LiveConductor()
    await serve_standin(conductor_side, standin)
    driver = MovingDriver(tmp_path, "host1")
    service_uuid, node_uuid = uuid.uuid4(), uuid.uuid4()
    manager = ComputeManager(driver, ConductorAPI(agent_side, timeout=5), node_uuid=node_uuid)
    server = RPCServer(agent_side, topic_for(service_uuid), manager, version=RPC_VERSION)
    await server.start(prefetch=8)
    try:
        live = LiveComputeAPI(ComputeAPI(caller_side, timeout=5))
        yield Rig(standin, driver, live, service_uuid, node_uuid)
        await eventually(lambda: not manager.in_flight())
        await asyncio.sleep(0.1)
    finally:
        for transport in transports:
            await transport.close()


def moving(rig: Rig) -> MovingDriver:
    assert isinstance(rig.driver, MovingDriver)
    return rig.driver


async def migrate_twice(rig: Rig, spec: InstanceSpec, migration: UUID) -> None:
    target = LiveTarget(driver="moving", uri="moving://there", address="127.0.0.1",
                        definition="<domain/>")  # fmt: skip
    await asyncio.gather(
        *(
            rig.live.live_migrate(
                RequestContext(), rig.service_uuid, spec.uuid, migration, paused=False,
                memory_mb=128, disk_gb=1, target=target,
            )
            for _ in range(2)
        )
    )  # fmt: skip


async def test_a_destination_prepared_twice_at_once_answers_one_target(rig: Rig) -> None:
    spec = make_spec()
    migration = uuid.uuid4()

    targets = await asyncio.gather(
        *(rig.live.prepare_live_migration(rig.ctx, rig.service_uuid, spec, migration)
          for _ in range(2))
    )  # fmt: skip

    assert targets[0] is not None
    assert targets[0] == targets[1]
    assert targets[0].uri == "moving://here"
    assert moving(rig).prepared == 1


async def test_a_source_told_twice_moves_the_guest_once_and_removes_its_copy(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)

    await migrate_twice(rig, spec, uuid.uuid4())
    await eventually(lambda: not rig.driver.guest_dir(spec.uuid).exists())
    await asyncio.sleep(0.3)

    assert moving(rig).copies == 1
    assert rig.conductor.status == "completed"
    assert rig.conductor.progress[0].memory_total_bytes == 128 * 1024 * 1024
    assert rig.conductor.progress[-1].memory_processed_bytes == 100


async def test_an_aborted_copy_leaves_the_guest_running_and_asks_the_switch(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    rig.conductor.abort_after = 2

    await migrate_twice(rig, spec, uuid.uuid4())
    await eventually(lambda: len(rig.conductor.switches) >= 2)
    await asyncio.sleep(0.3)

    assert rig.driver.power_state(spec.uuid) == "running"
    assert moving(rig).copies <= 2
    assert rig.conductor.status == "cancelled"


async def test_a_failed_copy_leaves_the_guest_running(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    moving(rig).fail = True
    rig.conductor.switch_answer = SwitchOutcome.RESUME

    await migrate_twice(rig, spec, uuid.uuid4())
    await eventually(lambda: len(rig.conductor.switches) >= 1)
    await asyncio.sleep(0.3)

    assert rig.driver.power_state(spec.uuid) == "running"
    assert rig.driver.guest_dir(spec.uuid).exists()


async def test_the_destination_resumes_the_guest_that_arrived_once_when_told_twice(
    rig: Rig,
) -> None:
    migration = uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": migration})
    await rig.driver.spawn(spec)  # as libvirt leaves it: this move's, paused
    await rig.driver.pause(spec.uuid)

    await asyncio.gather(
        *(rig.live.start_live_copy(rig.ctx, rig.service_uuid, spec, migration, paused=False)
          for _ in range(2))
    )  # fmt: skip

    assert rig.driver.power_state(spec.uuid) == "running"
    assert await rig.driver.list_instances() == [spec.uuid]


async def test_the_destination_with_no_guest_arrived_removes_what_it_prepared(rig: Rig) -> None:
    migration = uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": migration})
    await rig.live.prepare_live_migration(rig.ctx, rig.service_uuid, spec, migration)

    results = await asyncio.gather(
        *(rig.live.start_live_copy(rig.ctx, rig.service_uuid, spec, migration, paused=False)
          for _ in range(2)),
        return_exceptions=True,
    )  # fmt: skip

    assert all(isinstance(r, KeelError) and "no guest arrived" in str(r) for r in results)
    assert not moving(rig).incoming_dir(spec.uuid).exists()
    assert await rig.driver.list_instances() == []
