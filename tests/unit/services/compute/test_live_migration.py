"""The agent's live migration handlers (local driver) on the fake broker, each delivered
twice at once, with a stand-in conductor that answers as the real one would."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.live_rpc import LiveComputeAPI
from services.compute.manager import ComputeManager
from services.compute.rpcapi import RPC_VERSION, ComputeAPI, InstanceSpec, topic_for
from services.compute.virt.local import LocalDriver
from services.conductor.live_rpc import (
    LiveAction,
    LiveDirective,
    LiveMigrationProgress,
    LiveMigrationSwitch,
    LiveSwitch,
    SwitchOutcome,
)
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.exceptions import KeelError
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.rpc.server import RPCServer
from tests.unit.services.compute.standin import (
    StandInConductor,
    eventually,
    make_spec,
    serve_standin,
)


class LiveConductor(StandInConductor):
    """Answers progress and switch-over from one migration's status, as the real one."""

    def __init__(self) -> None:
        super().__init__()
        self.status = "running"
        #: After this many progress reports the migration is aborted.
        self.abort_after: int | None = None
        #: What the switch-over answers when the migration is running.
        self.switch_answer = SwitchOutcome.COMPLETED
        self.progress: list[LiveMigrationProgress] = []
        self.switches: list[LiveMigrationSwitch] = []

    async def live_migration_progress(
        self, ctx: RequestContext, req: LiveMigrationProgress
    ) -> LiveDirective:
        self.progress.append(req)
        if self.abort_after is not None and len(self.progress) > self.abort_after:
            self.status = "cancelled"
        if self.status == "running":
            return LiveDirective(action=LiveAction.CONTINUE)
        if self.status in ("post-migrating", "completed"):
            return LiveDirective(action=LiveAction.COMPLETE)
        return LiveDirective(action=LiveAction.ABORT, reason=f"it is {self.status}")

    async def live_migration_switch(
        self, ctx: RequestContext, req: LiveMigrationSwitch
    ) -> LiveSwitch:
        self.switches.append(req)
        if self.status == "running":
            self.status = "completed" if self.switch_answer is SwitchOutcome.COMPLETED else "failed"
            return LiveSwitch(outcome=self.switch_answer)
        if self.status == "completed":
            return LiveSwitch(outcome=SwitchOutcome.COMPLETED)
        return LiveSwitch(outcome=SwitchOutcome.RESUME, reason=f"it is {self.status}")


@dataclass
class Rig:
    conductor: LiveConductor
    driver: LocalDriver
    live: LiveComputeAPI
    service_uuid: UUID
    node_uuid: UUID
    ctx: RequestContext = field(default_factory=RequestContext)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    broker = FakeBroker()
    transports = [FakeTransport(broker) for _ in range(3)]
    for transport in transports:
        await transport.connect()
    conductor_side, agent_side, caller_side = transports
    standin = LiveConductor()
    await serve_standin(conductor_side, standin)
    driver = LocalDriver(tmp_path, "host1")
    service_uuid, node_uuid = uuid.uuid4(), uuid.uuid4()
    manager = ComputeManager(
        driver,
        ConductorAPI(agent_side, timeout=5),
        node_uuid=node_uuid,
        live_migration_seconds=0.5,
    )
    server = RPCServer(agent_side, topic_for(service_uuid), manager, version=RPC_VERSION)
    await server.start(prefetch=8)
    try:
        live = LiveComputeAPI(ComputeAPI(caller_side, timeout=5))
        yield Rig(standin, driver, live, service_uuid, node_uuid)
        # Every handler has finished before the broker goes.
        await eventually(lambda: not manager.in_flight())
        await asyncio.sleep(0.1)
    finally:
        for transport in transports:
            await transport.close()


async def migrate_twice(rig: Rig, spec: InstanceSpec, migration: UUID, paused: bool) -> None:
    await asyncio.gather(
        *(
            rig.live.live_migrate(
                rig.ctx, rig.service_uuid, spec.uuid, migration, paused=paused, memory_mb=512,
                disk_gb=1,
            )
            for _ in range(2)
        )
    )  # fmt: skip


async def settled(rig: Rig, count: int) -> None:
    """Until ``count`` progress reports were made and the migration ended, and a while."""
    await eventually(
        lambda: len(rig.conductor.progress) >= count and rig.conductor.status != "running"
    )
    await asyncio.sleep(0.3)


def gone(rig: Rig, spec: InstanceSpec) -> bool:
    return not (rig.driver.state_dir / "instances" / str(spec.uuid)).exists()


async def test_a_source_told_twice_switches_over_once_and_removes_its_copy(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    migration = uuid.uuid4()

    await migrate_twice(rig, spec, migration, paused=False)
    await eventually(lambda: gone(rig, spec) and len(rig.conductor.progress) >= 4)
    await asyncio.sleep(0.3)

    assert rig.conductor.status == "completed"
    assert gone(rig, spec)
    assert len(rig.conductor.switches) == 1
    assert rig.conductor.switches[0].compute_node_uuid == rig.node_uuid
    first = rig.conductor.progress[0]
    assert (first.memory_total_bytes, first.memory_processed_bytes) == (512 * 1024 * 1024, 0)
    assert any(p.memory_processed_bytes == p.memory_total_bytes for p in rig.conductor.progress)


async def test_an_abort_during_the_copy_leaves_the_guest_running(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    rig.conductor.abort_after = 1

    await migrate_twice(rig, spec, uuid.uuid4(), paused=False)
    await settled(rig, 2)

    assert rig.driver.power_state(spec.uuid) == "running"
    assert rig.conductor.switches == []


async def test_a_switch_that_failed_resumes_the_paused_guest_and_keeps_it(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    rig.conductor.switch_answer = SwitchOutcome.RESUME

    await migrate_twice(rig, spec, uuid.uuid4(), paused=False)
    await settled(rig, 2)

    assert rig.driver.power_state(spec.uuid) == "running"


async def test_a_paused_server_is_left_paused_when_its_migration_ends(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    await rig.driver.pause(spec.uuid)
    rig.conductor.abort_after = 0

    await migrate_twice(rig, spec, uuid.uuid4(), paused=True)
    await settled(rig, 2)

    assert rig.driver.power_state(spec.uuid) == "paused"


async def test_the_destination_starts_one_copy_when_told_twice_at_once(rig: Rig) -> None:
    migration = uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": migration})

    await asyncio.gather(
        *(
            rig.live.start_live_copy(rig.ctx, rig.service_uuid, spec, migration, paused=False)
            for _ in range(2)
        )
    )

    assert await rig.driver.list_instances() == [spec.uuid]
    assert rig.driver.power_state(spec.uuid) == "running"
    assert await rig.driver.origin(spec.uuid) == migration


async def test_a_destination_never_adopts_a_copy_another_move_left(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    migration = uuid.uuid4()
    moved = spec.model_copy(update={"origin": migration})

    for call in (
        rig.live.prepare_live_migration(rig.ctx, rig.service_uuid, moved, migration),
        rig.live.start_live_copy(rig.ctx, rig.service_uuid, moved, migration, paused=False),
    ):
        with pytest.raises(KeelError, match="not"):
            await call

    assert await rig.driver.origin(spec.uuid) is None
    assert rig.driver.power_state(spec.uuid) == "running"


async def test_rollback_twice_at_once_resumes_a_guest_left_paused(rig: Rig) -> None:
    spec = make_spec()
    await rig.driver.spawn(spec)
    await rig.driver.pause(spec.uuid)
    migration = uuid.uuid4()

    await asyncio.gather(
        *(
            rig.live.rollback_live_migration(
                rig.ctx, rig.service_uuid, spec.uuid, migration, resume=True
            )
            for _ in range(2)
        )
    )

    assert rig.driver.power_state(spec.uuid) == "running"
