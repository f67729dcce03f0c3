"""The compute manager behind its RPC topic, with a stand-in conductor, on the fake broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.compute.manager import ComputeManager
from services.compute.reconcile import GuestReconciler
from services.compute.rpcapi import (
    RPC_VERSION,
    ComputeAPI,
    GuestDisk,
    InstanceSpec,
    RebootType,
    topic_for,
)
from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import RPC_VERSION as RPC_CAP
from services.conductor.rpcapi import BuildVerdict, ConductorAPI, GuestFate
from shared.context import RequestContext
from shared.exceptions import BuildFailed, KeelError
from shared.objects.flavor import FlavorSnapshot
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.rpc.server import RPCServer
from tests.unit.services.compute.standin import (
    StandInConductor,
    eventually,
    make_spec,
    serve_standin,
)


class BreaksAfterBuilding(LocalDriver):
    """Builds the guest, then fails, as a hypervisor that cannot start it would."""

    async def spawn(self, spec: InstanceSpec) -> None:
        await super().spawn(spec)
        raise BuildFailed(f"the hypervisor could not start guest {spec.uuid}")


class Crashes(LocalDriver):
    async def spawn(self, spec: InstanceSpec) -> None:
        raise RuntimeError("driver bug")


class Slow(LocalDriver):
    async def spawn(self, spec: InstanceSpec) -> None:
        await asyncio.sleep(0.05)
        await super().spawn(spec)


@dataclass
class Rig:
    conductor: StandInConductor
    compute: ComputeAPI
    service_uuid: uuid.UUID
    state_dir: Path
    agent_side: FakeTransport

    def guest_dir(self, spec: InstanceSpec) -> Path:
        return self.state_dir / "instances" / str(spec.uuid)

    async def build(self, spec: InstanceSpec) -> None:
        await self.compute.build_and_run_instance(RequestContext(), self.service_uuid, spec)

    async def terminate(self, instance_uuid: uuid.UUID) -> None:
        await self.compute.terminate_instance(RequestContext(), self.service_uuid, instance_uuid)


class Gate:
    """A stand-in for the agent's fencing: open or shut by the test."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waited: list[tuple[str, uuid.UUID]] = []
        #: Set by the test when a heartbeat is answered again.
        self.answered = asyncio.Event()
        self.waited_for_answers = 0

    def serving(self) -> bool:
        return self.opened.is_set()

    async def wait_serving(self, what: str, instance_uuid: uuid.UUID) -> None:
        if not self.serving():
            self.waited.append((what, instance_uuid))
        await self.opened.wait()

    async def wait_answered(self) -> None:
        self.waited_for_answers += 1
        await self.answered.wait()
        self.answered.clear()


@asynccontextmanager
async def _rig(
    driver: LocalDriver, *, conductor_version: str | None = None, gate: Gate | None = None
) -> AsyncIterator[Rig]:
    broker = FakeBroker()
    transports = [FakeTransport(broker) for _ in range(3)]
    for transport in transports:
        await transport.connect()
    conductor_side, agent_side, caller_side = transports
    standin = StandInConductor()
    await serve_standin(conductor_side, standin)
    service_uuid = uuid.uuid4()
    conductor = ConductorAPI(agent_side, timeout=5, version_cap=conductor_version or RPC_CAP)
    manager = ComputeManager(driver, conductor, node_uuid=uuid.uuid4(), gate=gate)
    server = RPCServer(agent_side, topic_for(service_uuid), manager, version=RPC_VERSION)
    await server.start(prefetch=8)
    try:
        yield Rig(standin, ComputeAPI(caller_side), service_uuid, driver.state_dir, agent_side)
    finally:
        for transport in transports:
            await transport.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with _rig(LocalDriver(tmp_path, "host1")) as made:
        yield made


async def test_build_reports_success_and_the_guest_exists(rig: Rig) -> None:
    spec = make_spec()

    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))

    [result] = rig.conductor.results_for(spec.uuid)
    assert result.success
    assert (rig.guest_dir(spec) / "disk").is_file()
    assert (rig.guest_dir(spec) / "metadata.json").is_file()


async def test_repeated_build_reports_success_again_without_a_second_guest(rig: Rig) -> None:
    spec = make_spec()

    await rig.build(spec)
    await rig.build(spec)
    await eventually(lambda: len(rig.conductor.results_for(spec.uuid)) == 2)

    assert all(r.success for r in rig.conductor.results_for(spec.uuid))
    assert [p.name for p in (rig.state_dir / "instances").iterdir()] == [str(spec.uuid)]


async def test_build_failure_is_reported_and_leaves_no_guest(tmp_path: Path) -> None:
    async with _rig(BreaksAfterBuilding(tmp_path, "host1")) as rig:
        spec = make_spec()

        await rig.build(spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))

        [result] = rig.conductor.results_for(spec.uuid)
        assert not result.success
        assert result.message == f"the hypervisor could not start guest {spec.uuid}"
        assert list((tmp_path / "instances").iterdir()) == []


async def test_unexpected_driver_error_is_reported_as_a_failure(tmp_path: Path) -> None:
    async with _rig(Crashes(tmp_path, "host1")) as rig:
        spec = make_spec()

        await rig.build(spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))

        [result] = rig.conductor.results_for(spec.uuid)
        assert not result.success
        assert result.message == "RuntimeError: driver bug"
        assert not rig.guest_dir(spec).exists()


async def test_terminate_removes_the_guest_and_reports_it_deleted(rig: Rig) -> None:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))

    await rig.terminate(spec.uuid)
    await eventually(lambda: spec.uuid in rig.conductor.deleted)

    assert not rig.guest_dir(spec).exists()


async def test_a_withdrawn_delete_or_stop_that_arrives_later_changes_nothing(rig: Rig) -> None:
    """keel-api withdrew them (answered 503) before their messages arrived: the agent takes
    each request first, is told no, and leaves the guest as it is."""
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    stop, delete = RequestContext(), RequestContext()
    rig.conductor.withdrawn |= {stop.request_id, delete.request_id}

    await rig.compute.stop_instance(stop, rig.service_uuid, spec.uuid)
    await rig.compute.terminate_instance(delete, rig.service_uuid, spec.uuid)
    await eventually(lambda: len(rig.conductor.taken) == 2)
    await asyncio.sleep(0.1)

    assert rig.guest_dir(spec).exists()
    assert rig.conductor.deleted == []
    assert rig.conductor.action_results == []
    assert [t.request_id for t in rig.conductor.taken] == [stop.request_id, delete.request_id]


async def test_a_delete_waits_until_a_conductor_can_take_its_request(tmp_path: Path) -> None:
    """It may have been withdrawn (keel-api answered 503): nothing is done before a
    conductor answers, and then what it answers is done."""
    gate = Gate()
    gate.opened.set()
    async with _rig(LocalDriver(tmp_path, "host1"), gate=gate) as rig:
        spec = make_spec()
        await rig.build(spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
        rig.conductor.take_fails = True

        await rig.terminate(spec.uuid)
        await eventually(lambda: gate.waited_for_answers == 1)
        await asyncio.sleep(0.1)
        assert rig.guest_dir(spec).exists(), "not deleted while no conductor takes it"

        rig.conductor.take_fails = False
        gate.answered.set()  # heartbeats are answered again
        await eventually(lambda: spec.uuid in rig.conductor.deleted)
        assert not rig.guest_dir(spec).exists()


async def test_without_a_contact_watch_an_untaken_request_is_tried_again_later(
    rig: Rig,
) -> None:
    """The failure is transient: the message goes back to be delivered again."""
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    rig.conductor.take_fails = True

    await rig.terminate(spec.uuid)
    await eventually(lambda: len(rig.conductor.taken) >= 2)
    assert rig.guest_dir(spec).exists()

    rig.conductor.take_fails = False
    await eventually(lambda: spec.uuid in rig.conductor.deleted)


async def test_terminate_of_a_missing_guest_still_reports_it_deleted(rig: Rig) -> None:
    missing = uuid.uuid4()

    await rig.terminate(missing)
    await eventually(lambda: missing in rig.conductor.deleted)

    assert rig.conductor.build_results == []


async def test_terminate_during_a_build_waits_for_it_and_then_removes_the_guest(
    tmp_path: Path,
) -> None:
    async with _rig(Slow(tmp_path, "host1")) as rig:
        spec = make_spec()

        await rig.build(spec)
        await rig.terminate(spec.uuid)
        await eventually(lambda: spec.uuid in rig.conductor.deleted)

        [result] = rig.conductor.results_for(spec.uuid)
        assert result.success
        assert not rig.guest_dir(spec).exists()


async def test_twin_builds_delivered_at_once_make_one_guest(tmp_path: Path) -> None:
    async with _rig(Slow(tmp_path, "host1")) as rig:
        spec = make_spec()
        await rig.build(spec)
        await eventually(lambda: len(rig.conductor.checks) == 1)
        # The agent's connection drops mid-build: the broker delivers the build again
        # while the first delivery is still building.
        rig.agent_side.lose_connection()

        await eventually(lambda: len(rig.conductor.results_for(spec.uuid)) == 2)

        assert all(r.success for r in rig.conductor.results_for(spec.uuid))
        assert [p.name for p in (rig.state_dir / "instances").iterdir()] == [str(spec.uuid)]


async def test_build_nobody_wants_any_more_is_not_made(rig: Rig) -> None:
    spec = make_spec()
    rig.conductor.verdicts[spec.uuid] = [BuildVerdict.ABANDON]

    await rig.build(spec)
    await eventually(lambda: len(rig.conductor.checks) == 1)
    await rig.build(make_spec())  # handled after the first: its result marks the end
    await eventually(lambda: len(rig.conductor.build_results) == 1)

    assert rig.conductor.results_for(spec.uuid) == []
    assert not rig.guest_dir(spec).exists()


async def test_build_given_up_while_it_ran_removes_the_guest(rig: Rig) -> None:
    spec = make_spec()
    rig.conductor.verdicts[spec.uuid] = [BuildVerdict.BUILD, BuildVerdict.ABANDON]

    await rig.build(spec)
    await eventually(lambda: len(rig.conductor.checks) == 2)
    await rig.terminate(uuid.uuid4())  # queued behind nothing; ends after the build's checks
    await eventually(lambda: len(rig.conductor.deleted) == 1)

    assert rig.conductor.results_for(spec.uuid) == []
    assert not rig.guest_dir(spec).exists()


async def test_repeated_build_of_a_guest_living_here_leaves_it_alone(rig: Rig) -> None:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    rig.conductor.verdicts[spec.uuid] = [BuildVerdict.LEAVE]

    await rig.build(spec)
    await eventually(lambda: len(rig.conductor.checks) == 3)

    assert (rig.guest_dir(spec) / "disk").is_file()
    assert len(rig.conductor.results_for(spec.uuid)) == 1


async def test_leftover_of_an_abandoned_build_is_removed(rig: Rig) -> None:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    rig.conductor.verdicts[spec.uuid] = [BuildVerdict.ABANDON]

    await rig.build(spec)
    await eventually(lambda: not rig.guest_dir(spec).exists())

    assert len(rig.conductor.results_for(spec.uuid)) == 1


async def test_conductor_too_old_to_check_gets_the_build_done(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1"), conductor_version="1.0") as rig:
        spec = make_spec()

        await rig.build(spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))

        assert rig.conductor.checks == []
        assert (rig.guest_dir(spec) / "disk").is_file()


async def test_twin_terminates_delivered_at_once_remove_the_guest_once(tmp_path: Path) -> None:
    async with _rig(Slow(tmp_path, "host1")) as rig:
        spec = make_spec()
        await rig.build(spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))

        await asyncio.gather(rig.terminate(spec.uuid), rig.terminate(spec.uuid))
        await eventually(lambda: rig.conductor.deleted.count(spec.uuid) == 2)

        assert not rig.guest_dir(spec).exists()
        assert list((tmp_path / "instances").iterdir()) == []


async def test_prepare_migration_shuts_the_guest_down_and_keeps_it(rig: Rig) -> None:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    ctx, migration = RequestContext(), uuid.uuid4()

    answers = await asyncio.gather(
        *(
            rig.compute.prepare_migration(ctx, rig.service_uuid, spec.uuid, migration)
            for _ in range(2)
        )
    )

    assert (rig.guest_dir(spec) / "power").read_text().strip() == "shutdown"
    assert [answer.disk for answer in answers] == [None, None]


class ExportsItsDisk(LocalDriver):
    """A driver whose guests have a disk to copy (as the libvirt driver's do)."""

    async def migration_disk(self, instance_uuid: uuid.UUID) -> GuestDisk | None:
        return GuestDisk(machine="here", path=str(self.guest_dir(instance_uuid) / "disk"))


async def test_prepare_migration_answers_where_the_disk_is_twice_alike(tmp_path: Path) -> None:
    async with _rig(ExportsItsDisk(tmp_path, "host1")) as rig:
        spec = make_spec()
        await rig.build(spec)
        await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
        ctx, migration = RequestContext(), uuid.uuid4()

        first, second = await asyncio.gather(
            *(
                rig.compute.prepare_migration(ctx, rig.service_uuid, spec.uuid, migration)
                for _ in range(2)
            )
        )

    assert first == second
    assert first.disk == GuestDisk(machine="here", path=str(rig.guest_dir(spec) / "disk"))


async def test_remove_moved_guest_twice_at_once_removes_it_once(rig: Rig) -> None:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    ctx, migration = RequestContext(), uuid.uuid4()

    await asyncio.gather(
        *(
            rig.compute.remove_moved_guest(ctx, rig.service_uuid, spec.uuid, migration)
            for _ in range(2)
        )
    )

    assert not rig.guest_dir(spec).exists()


async def test_finish_revert_starts_the_source_guest_again(rig: Rig) -> None:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    ctx, migration = RequestContext(), uuid.uuid4()
    await rig.compute.prepare_migration(ctx, rig.service_uuid, spec.uuid, migration)

    await rig.compute.finish_revert(ctx, rig.service_uuid, spec.uuid, migration, power_on=True)

    assert (rig.guest_dir(spec) / "power").read_text().strip() == "running"


async def test_finish_revert_without_the_guest_is_an_error_for_the_conductor(rig: Rig) -> None:
    missing, migration = uuid.uuid4(), uuid.uuid4()

    with pytest.raises(KeelError, match="cannot be reverted to it"):
        await rig.compute.finish_revert(
            RequestContext(), rig.service_uuid, missing, migration, power_on=False
        )


async def test_a_moved_copy_is_removed_and_reported_by_the_guest_report(tmp_path: Path) -> None:
    broker = FakeBroker()
    conductor_side, agent_side = FakeTransport(broker), FakeTransport(broker)
    await conductor_side.connect()
    await agent_side.connect()
    standin = StandInConductor()
    await serve_standin(conductor_side, standin)
    driver = LocalDriver(tmp_path, "host1")
    kept, moved = make_spec(), make_spec()
    await driver.spawn(kept)
    await driver.spawn(moved)
    node_uuid, migration = uuid.uuid4(), uuid.uuid4()
    standin.fates[moved.uuid] = GuestFate.MOVED
    standin.moves[moved.uuid] = migration
    conductor = ConductorAPI(agent_side, timeout=5)
    manager = ComputeManager(driver, conductor, node_uuid=node_uuid)
    try:
        await GuestReconciler(driver, conductor, manager, node_uuid).reconcile()
    finally:
        await conductor_side.close()
        await agent_side.close()

    assert await driver.list_instances() == [kept.uuid]
    assert [(c.migration_uuid, c.compute_node_uuid) for c in standin.copies_removed] == [
        (migration, node_uuid)
    ]


async def test_a_destination_never_adopts_a_copy_another_move_left(rig: Rig) -> None:
    """Finding 2: a guest of the server already here, made by another move, is not adopted."""
    ctx, stale_move, this_move = RequestContext(), uuid.uuid4(), uuid.uuid4()
    stale = make_spec().model_copy(update={"origin": stale_move})
    await rig.compute.rebuild_instance(ctx, rig.service_uuid, stale, stale_move)
    await eventually(lambda: len(rig.conductor.move_results) == 1)
    spec = stale.model_copy(update={"origin": this_move, "display_name": "fresh"})

    await asyncio.gather(
        *(rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, this_move) for _ in range(2))
    )
    await eventually(lambda: len(rig.conductor.move_results) == 3)

    results = [r for r in rig.conductor.move_results if r.migration_uuid == this_move]
    assert [r.success for r in results] == [False, False]
    assert f"made by move {stale_move}" in results[0].message
    # Kept (its data intact: the stale move's spec) and shut down, never rebuilt over.
    assert (rig.guest_dir(spec) / "power").read_text().strip() == "shutdown"
    assert '"display_name": "fresh"' not in (rig.guest_dir(spec) / "metadata.json").read_text()


async def test_a_repeated_rebuild_for_the_same_move_reports_success_again(rig: Rig) -> None:
    ctx, move = RequestContext(), uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": move})

    await asyncio.gather(
        *(rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, move) for _ in range(2))
    )
    await eventually(lambda: len(rig.conductor.move_results) == 2)

    assert [r.success for r in rig.conductor.move_results] == [True, True]
    assert (rig.guest_dir(spec) / "power").read_text().strip() == "running"


async def test_a_rebuild_the_move_no_longer_waits_for_builds_nothing(rig: Rig) -> None:
    """A rebuild delivered after its move ended (twice, at once): no copy, no result."""
    ctx, move = RequestContext(), uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": move})
    rig.conductor.move_verdicts[move] = [BuildVerdict.ABANDON]

    await asyncio.gather(
        *(rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, move) for _ in range(2))
    )
    await eventually(lambda: len(rig.conductor.move_checks) == 2)

    assert not rig.guest_dir(spec).exists()
    assert rig.conductor.move_results == []


async def test_a_copy_built_while_its_move_ended_is_removed(rig: Rig) -> None:
    """The move waited before the copy was built and no longer does after: it goes."""
    ctx, move = RequestContext(), uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": move})
    rig.conductor.move_verdicts[move] = [BuildVerdict.BUILD, BuildVerdict.ABANDON]

    await rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, move)
    await eventually(lambda: len(rig.conductor.move_checks) == 2)
    await eventually(lambda: not rig.guest_dir(spec).exists())

    assert [c.migration_uuid for c in rig.conductor.move_checks] == [move, move]
    assert rig.conductor.move_results == []


async def test_a_move_check_that_fails_once_is_asked_again_and_the_copy_built(rig: Rig) -> None:
    """The conductor cannot answer check_move once: the rebuild goes back to its queue and,
    delivered again, builds the copy and reports it once."""
    ctx, move = RequestContext(), uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": move})
    rig.conductor.move_check_fails = True

    await rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, move)
    await eventually(lambda: len(rig.conductor.move_results) == 1)

    assert len(rig.conductor.move_checks) == 3  # failed, then before and after building
    assert [r.success for r in rig.conductor.move_results] == [True]
    assert (rig.guest_dir(spec) / "power").read_text().strip() == "running"


async def test_remove_moved_guest_keeps_a_copy_another_move_made(rig: Rig) -> None:
    ctx, built_by, other = RequestContext(), uuid.uuid4(), uuid.uuid4()
    spec = make_spec().model_copy(update={"origin": built_by})
    await rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, built_by)
    await eventually(lambda: len(rig.conductor.move_results) == 1)

    await rig.compute.remove_moved_guest(ctx, rig.service_uuid, spec.uuid, other, only_origin=other)
    assert rig.guest_dir(spec).exists()

    await rig.compute.remove_moved_guest(
        ctx, rig.service_uuid, spec.uuid, built_by, only_origin=built_by
    )
    assert not rig.guest_dir(spec).exists()


async def test_while_the_agent_does_not_serve_nothing_starts_but_removals_go_on(
    tmp_path: Path,
) -> None:
    """After a loss of contact, builds, starts and reboots wait for the reconcile."""
    gate = Gate()
    gate.opened.set()
    async with _rig(LocalDriver(tmp_path, "host1"), gate=gate) as rig:
        kept, doomed, waiting = make_spec(), make_spec(), make_spec()
        for spec in (kept, doomed):
            await rig.build(spec)
        await eventually(lambda: len(rig.conductor.build_results) == 2)
        ctx = RequestContext()
        await rig.compute.stop_instance(ctx, rig.service_uuid, kept.uuid)
        await eventually(lambda: "shutdown" in _power(rig, kept))

        gate.opened.clear()
        await rig.build(waiting)
        await rig.compute.start_instance(ctx, rig.service_uuid, kept.uuid)
        await rig.compute.reboot_instance(ctx, rig.service_uuid, kept.uuid, RebootType.HARD)
        await rig.terminate(doomed.uuid)
        await eventually(lambda: doomed.uuid in rig.conductor.deleted)
        await eventually(lambda: len(gate.waited) == 3)
        assert not rig.guest_dir(waiting).exists()
        assert "shutdown" in _power(rig, kept)

        gate.opened.set()
        await eventually(lambda: bool(rig.conductor.results_for(waiting.uuid)))
        await eventually(lambda: "running" in _power(rig, kept))
        assert {what for what, _ in gate.waited} == {"build", "start", "reboot"}


def _power(rig: Rig, spec: InstanceSpec) -> str:
    try:
        return (rig.guest_dir(spec) / "power").read_text()
    except FileNotFoundError:
        return "running"


async def test_a_resize_on_the_guests_own_host_resizes_it_in_place(rig: Rig) -> None:
    """Twice at once: one guest, its data and origin kept, the new flavor, running."""
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    ctx, move = RequestContext(), uuid.uuid4()
    await rig.compute.prepare_migration(ctx, rig.service_uuid, spec.uuid, move)
    larger = FlavorSnapshot(flavorid="2", name="m1.small", vcpus=1, memory_mb=2048, root_gb=3)
    resized = spec.model_copy(update={"flavor": larger, "origin": move})

    await asyncio.gather(
        *(
            rig.compute.rebuild_instance(ctx, rig.service_uuid, resized, move, in_place=True)
            for _ in range(2)
        )
    )
    await eventually(lambda: len(rig.conductor.move_results) == 2)

    assert [r.success for r in rig.conductor.move_results] == [True, True]
    kept = InstanceSpec.model_validate_json((rig.guest_dir(spec) / "metadata.json").read_text())
    assert (kept.flavor, kept.origin) == (larger, None)
    assert (rig.guest_dir(spec) / "disk").stat().st_size == 3 * 2**30
    assert (rig.guest_dir(spec) / "power").read_text().strip() == "running"

    await rig.compute.finish_revert(
        ctx, rig.service_uuid, spec.uuid, move, power_on=True, flavor=spec.flavor
    )
    back = InstanceSpec.model_validate_json((rig.guest_dir(spec) / "metadata.json").read_text())
    assert back.flavor == spec.flavor
    assert (rig.guest_dir(spec) / "power").read_text().strip() == "running"


async def test_a_resize_in_place_of_a_missing_guest_fails_the_move(rig: Rig) -> None:
    ctx, move, spec = RequestContext(), uuid.uuid4(), make_spec()

    await rig.compute.rebuild_instance(ctx, rig.service_uuid, spec, move, in_place=True)
    await eventually(lambda: len(rig.conductor.move_results) == 1)

    [result] = rig.conductor.move_results
    assert not result.success
    assert "does not exist" in result.message
    assert not rig.guest_dir(spec).exists()
