"""The agent's ``snapshot_instance``: the guest's disk written to the upload URL and the
result reported, on the fake broker with a stand-in conductor and the local driver (the
upload itself is recorded instead of sent: unit tests use no network)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from services.compute import manager as manager_module
from services.compute.rpcapi import InstanceSpec, SnapshotInstance
from services.compute.virt.fake import FakeDriver, fake_disk
from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import PowerAction
from shared.context import RequestContext
from shared.exceptions import KeelError
from tests.unit.services.compute.standin import eventually, make_spec
from tests.unit.services.compute.test_manager import Rig, _rig

URL = "http://127.0.0.1:9/image/upload/x?expires=1&signature=s"


class Uploads:
    """What the agent sent: each upload's URL and data; fails while ``failing`` is set."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.failing: str | None = None

    def __call__(self, url: str, path: Path) -> int:
        if self.failing is not None:
            raise KeelError(self.failing)
        data = path.read_bytes()
        self.sent.append((url, data))
        return len(data)


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> Uploads:
    recorder = Uploads()
    monkeypatch.setattr(manager_module, "upload", recorder)
    return recorder


async def built(rig: Rig, data: bytes = b"") -> InstanceSpec:
    spec = make_spec(root_gb=0)
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    if data:
        (rig.guest_dir(spec) / "disk").write_bytes(data)
    return spec


async def ask(rig: Rig, spec: InstanceSpec, ctx: RequestContext, image_id: uuid.UUID) -> None:
    req = SnapshotInstance(
        instance_uuid=spec.uuid, image_id=image_id, disk_format="raw", upload_url=URL
    )
    await rig.compute.snapshot_instance(ctx, rig.service_uuid, req)


async def test_the_disk_is_uploaded_and_the_result_reported_with_the_guest_left_running(
    tmp_path: Path, uploads: Uploads
) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        spec = await built(rig, b"the guest's own bytes")
        ctx = RequestContext()

        await ask(rig, spec, ctx, uuid.uuid4())
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        result = rig.conductor.action_results[0]
        assert (result.action, result.success) == (PowerAction.SNAPSHOT, True)
        assert uploads.sent == [(URL, b"the guest's own bytes")]
        assert driver.power_state(spec.uuid) == "running"
        take = rig.conductor.taken[-1]
        assert (take.request_id, take.task) == (ctx.request_id, "image_snapshot")
        assert take.node_uuid is not None


async def test_twice_at_once_uploads_the_same_data_one_after_the_other(
    tmp_path: Path, uploads: Uploads
) -> None:
    """The conductor takes only the first (the task has moved on for the second); the
    stand-in takes both, and the two run one after the other, each whole."""
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        spec = await built(rig, b"x" * 4096)
        ctx, image_id = RequestContext(), uuid.uuid4()

        await asyncio.gather(ask(rig, spec, ctx, image_id), ask(rig, spec, ctx, image_id))
        await eventually(lambda: len(rig.conductor.action_results) == 2)

        assert all(result.success for result in rig.conductor.action_results)
        assert [data for _, data in uploads.sent] == [b"x" * 4096, b"x" * 4096]


async def test_a_withdrawn_request_uploads_nothing(tmp_path: Path, uploads: Uploads) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        spec = await built(rig)
        ctx = RequestContext()
        rig.conductor.withdrawn.add(ctx.request_id)

        await ask(rig, spec, ctx, uuid.uuid4())
        await eventually(lambda: bool(rig.conductor.taken))
        await asyncio.sleep(0.1)

        assert uploads.sent == []
        assert rig.conductor.action_results == []


async def test_a_failed_upload_is_reported_and_the_guest_left_as_it_was(
    tmp_path: Path, uploads: Uploads
) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        spec = await built(rig)
        uploads.failing = "keel-api refused the snapshot's data (409): gone"

        await ask(rig, spec, RequestContext(), uuid.uuid4())
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        result = rig.conductor.action_results[0]
        assert (result.action, result.success) == (PowerAction.SNAPSHOT, False)
        assert "refused the snapshot's data" in result.message
        assert driver.power_state(spec.uuid) == "running"


async def test_a_guest_that_is_not_here_is_a_failure(tmp_path: Path, uploads: Uploads) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        await ask(rig, make_spec(root_gb=0), RequestContext(), uuid.uuid4())
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        assert not rig.conductor.action_results[0].success
        assert uploads.sent == []


async def test_the_fake_drivers_snapshot_is_small_and_always_the_same(tmp_path: Path) -> None:
    driver = FakeDriver("host1")
    spec = make_spec()
    await driver.spawn(spec)

    await driver.snapshot(spec.uuid, tmp_path / "a", "qcow2")
    await driver.snapshot(spec.uuid, tmp_path / "b", "qcow2")

    first = (tmp_path / "a").read_bytes()
    assert first == (tmp_path / "b").read_bytes() == fake_disk(spec)
    assert len(first) == 64 * 1024
    assert str(spec.uuid).encode() in first
