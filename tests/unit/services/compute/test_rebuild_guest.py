"""The agent's ``rebuild_guest``: the guest made again from the spec's image, on the fake
broker with a stand-in conductor and the local driver."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from services.compute.rpcapi import InstanceSpec
from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import PowerAction
from shared.context import RequestContext
from shared.exceptions import BuildFailed
from tests.unit.services.compute.standin import eventually, make_spec
from tests.unit.services.compute.test_manager import Rig, _rig

NEW_IMAGE = "cirros-alt"


def made_from(rig: Rig, spec: InstanceSpec) -> str:
    metadata = json.loads((rig.guest_dir(spec) / "metadata.json").read_text())
    image: str = metadata["image_ref"]
    return image


async def built(rig: Rig) -> InstanceSpec:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    return spec


async def send(rig: Rig, spec: InstanceSpec, ctx: RequestContext, *, off: bool = False) -> None:
    new = spec.model_copy(update={"image_ref": NEW_IMAGE})
    await rig.compute.rebuild_guest(ctx, rig.service_uuid, new, powered_off=off)


async def test_the_guest_is_made_again_from_the_new_image_and_the_result_reported(
    tmp_path: Path,
) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        spec = await built(rig)
        ctx = RequestContext()

        await send(rig, spec, ctx)
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        result = rig.conductor.action_results[0]
        assert (result.action, result.success) == (PowerAction.REBUILD, True)
        assert made_from(rig, spec) == NEW_IMAGE
        assert driver.power_state(spec.uuid) == "running"
        take = rig.conductor.taken[-1]
        assert (take.request_id, take.task) == (ctx.request_id, "rebuild_spawning")
        assert take.node_uuid is not None


async def test_a_shutoff_server_is_rebuilt_shut_down(tmp_path: Path) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        spec = await built(rig)

        await send(rig, spec, RequestContext(), off=True)
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        assert rig.conductor.action_results[0].success
        assert made_from(rig, spec) == NEW_IMAGE
        assert driver.power_state(spec.uuid) != "running"


async def test_twice_at_once_leaves_one_guest_from_the_new_image(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        spec = await built(rig)
        ctx = RequestContext()

        await asyncio.gather(send(rig, spec, ctx), send(rig, spec, ctx))
        await eventually(lambda: len(rig.conductor.action_results) == 2)

        assert all(result.success for result in rig.conductor.action_results)
        assert [p.name for p in (rig.state_dir / "instances").iterdir()] == [str(spec.uuid)]
        assert made_from(rig, spec) == NEW_IMAGE


async def test_a_rebuild_not_taken_leaves_the_guest_as_it_was(tmp_path: Path) -> None:
    """Withdrawn by keel-api, ended already, or the server is elsewhere: not taken."""
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        spec = await built(rig)
        ctx = RequestContext()
        rig.conductor.withdrawn.add(ctx.request_id)

        await send(rig, spec, ctx)
        await eventually(lambda: any(t.request_id == ctx.request_id for t in rig.conductor.taken))
        await asyncio.sleep(0.1)

        assert made_from(rig, spec) == "cirros"
        assert rig.conductor.action_results == []


class CannotMake(LocalDriver):
    """Builds the first guest; every later one fails, as a broken image would."""

    made = 0

    async def spawn(self, spec: InstanceSpec) -> None:
        self.made += 1
        if self.made > 1:
            raise BuildFailed(f"image {spec.image_ref} cannot be read")
        await super().spawn(spec)


async def test_a_failed_rebuild_is_reported_with_its_reason_and_leaves_no_guest(
    tmp_path: Path,
) -> None:
    async with _rig(CannotMake(tmp_path, "host1")) as rig:
        spec = await built(rig)

        await send(rig, spec, RequestContext())
        await eventually(lambda: len(rig.conductor.action_results) == 1)

        result = rig.conductor.action_results[0]
        assert (result.success, result.message) == (False, "image cirros-alt cannot be read")
        assert not rig.guest_dir(spec).exists()
