"""The agent's shelve steps: ``shelve_instance`` powers the guest off and writes its disk
to the upload URL, ``shelve_offload_instance`` destroys it, ``unshelve_instance`` powers
it on; each reports its result, each taken first (on the fake broker with a stand-in
conductor and the local driver; the upload is recorded instead of sent)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from services.compute.rpcapi import InstanceSpec, ShelveInstance
from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import PowerAction
from shared.context import RequestContext
from tests.unit.services.compute.standin import eventually
from tests.unit.services.compute.test_manager import Rig, _rig
from tests.unit.services.compute.test_snapshot_instance import URL, Uploads, built, uploads

__all__ = ["uploads"]


async def shelve(rig: Rig, spec: InstanceSpec, ctx: RequestContext, image_id: uuid.UUID) -> None:
    req = ShelveInstance(
        instance_uuid=spec.uuid, image_id=image_id, disk_format="raw", upload_url=URL
    )
    await rig.compute.shelve_instance(ctx, rig.service_uuid, req)


async def test_shelve_powers_the_guest_off_writes_its_disk_and_keeps_it(
    tmp_path: Path, uploads: Uploads
) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        spec = await built(rig, b"kept on the shelf")
        ctx = RequestContext()

        await shelve(rig, spec, ctx, uuid.uuid4())
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        result = rig.conductor.action_results[0]
        assert (result.action, result.success) == (PowerAction.SHELVE, True)
        assert uploads.sent == [(URL, b"kept on the shelf")]
        assert driver.power_state(spec.uuid) == "shutdown"
        assert spec.uuid in await driver.list_instances()
        take = rig.conductor.taken[-1]
        assert (take.request_id, take.task) == (ctx.request_id, "shelving")


async def test_shelve_twice_at_once_writes_whole_data_each_time(
    tmp_path: Path, uploads: Uploads
) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        spec = await built(rig, b"y" * 4096)
        ctx, image_id = RequestContext(), uuid.uuid4()

        await asyncio.gather(shelve(rig, spec, ctx, image_id), shelve(rig, spec, ctx, image_id))
        await eventually(lambda: len(rig.conductor.action_results) == 2)

        assert all(r.action is PowerAction.SHELVE for r in rig.conductor.action_results)
        assert [data for _, data in uploads.sent] == [b"y" * 4096, b"y" * 4096]


async def test_a_withdrawn_shelve_leaves_the_guest_running(
    tmp_path: Path, uploads: Uploads
) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        spec = await built(rig)
        ctx = RequestContext()
        rig.conductor.withdrawn.add(ctx.request_id)

        await shelve(rig, spec, ctx, uuid.uuid4())
        await eventually(lambda: bool(rig.conductor.taken))
        await asyncio.sleep(0.1)

        assert uploads.sent == []
        assert rig.conductor.action_results == []
        assert driver.power_state(spec.uuid) == "running"


async def test_a_failed_upload_is_a_failed_shelve(tmp_path: Path, uploads: Uploads) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        spec = await built(rig)
        uploads.failing = "keel-api refused the shelved image's data (409)"

        await shelve(rig, spec, RequestContext(), uuid.uuid4())
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        result = rig.conductor.action_results[0]
        assert (result.action, result.success) == (PowerAction.SHELVE, False)
        assert "refused" in result.message


async def test_offload_destroys_the_guest_twice_at_once_and_unshelve_powers_one_on(
    tmp_path: Path, uploads: Uploads
) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        gone, kept = await built(rig), await built(rig)
        await driver.power_off(kept.uuid)
        ctx = RequestContext()

        await asyncio.gather(
            rig.compute.shelve_offload_instance(ctx, rig.service_uuid, gone.uuid),
            rig.compute.shelve_offload_instance(ctx, rig.service_uuid, gone.uuid),
            rig.compute.unshelve_instance(RequestContext(), rig.service_uuid, kept.uuid),
        )
        await eventually(lambda: len(rig.conductor.action_results) == 3)

        actions = sorted((r.action.value, r.success) for r in rig.conductor.action_results)
        assert actions == [("shelve_offload", True), ("shelve_offload", True), ("unshelve", True)]
        assert await driver.list_instances() == [kept.uuid]
        assert driver.power_state(kept.uuid) == "running"
        offload_takes = [t for t in rig.conductor.taken if t.request_id == ctx.request_id]
        assert {t.task for t in offload_takes} == {"shelving_offloading"}
