"""Soft delete and restore through the agent's RPC topic: the guest is powered off and
kept, or powered on again, and each delivery reports how it went."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import PowerAction
from shared.context import RequestContext
from tests.unit.services.compute.standin import eventually
from tests.unit.services.compute.test_manager import _rig
from tests.unit.services.compute.test_pause_suspend import built, outcomes, power

CTX = RequestContext()


async def test_soft_delete_keeps_the_guest_off_and_restore_runs_it_again(tmp_path: Path) -> None:
    driver = LocalDriver(tmp_path, "host1")
    async with _rig(driver) as rig:
        guest = await built(rig)
        await rig.compute.soft_delete_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: outcomes(rig, guest) == [(PowerAction.SOFT_DELETE, True)])
        assert power(rig, guest) == "shutdown"
        assert guest in await driver.list_instances()

        await rig.compute.restore_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest)[1] == (PowerAction.RESTORE, True)
        assert power(rig, guest) == "running"


async def test_each_delivered_twice_at_once_leaves_the_guest_as_one_delivery_would(
    tmp_path: Path,
) -> None:
    """At-least-once delivery: both copies report success (the conductor's compare-and-swap
    makes the second change nothing); the guest is off, then running, once."""
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await asyncio.gather(
            rig.compute.soft_delete_instance(CTX, rig.service_uuid, guest),
            rig.compute.soft_delete_instance(CTX, rig.service_uuid, guest),
        )
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest) == [(PowerAction.SOFT_DELETE, True)] * 2
        assert power(rig, guest) == "shutdown"

        await asyncio.gather(
            rig.compute.restore_instance(CTX, rig.service_uuid, guest),
            rig.compute.restore_instance(CTX, rig.service_uuid, guest),
        )
        await eventually(lambda: len(outcomes(rig, guest)) == 4)
        assert outcomes(rig, guest)[2:] == [(PowerAction.RESTORE, True)] * 2
        assert power(rig, guest) == "running"
