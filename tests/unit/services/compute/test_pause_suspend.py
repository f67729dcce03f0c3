"""Pause, unpause, suspend, resume and the host's uptime, through the agent's RPC topic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from uuid import UUID

from services.compute.uptime import format_uptime, host_uptime
from services.compute.virt.local import LocalDriver
from services.conductor.rpcapi import PowerAction
from shared.context import RequestContext
from shared.exceptions import KeelError
from tests.unit.services.compute.standin import eventually, make_spec
from tests.unit.services.compute.test_manager import Rig, _rig

CTX = RequestContext()


class PausesOnSecondTry(LocalDriver):
    """A hypervisor whose first pause fails (a busy monitor, say)."""

    failed = False

    async def pause(self, instance_uuid: UUID) -> None:
        if not self.failed:
            self.failed = True
            raise KeelError("the monitor was busy")
        await super().pause(instance_uuid)


def power(rig: Rig, instance_uuid: UUID) -> str:
    return (rig.state_dir / "instances" / str(instance_uuid) / "power").read_text().strip()


def console(rig: Rig, instance_uuid: UUID) -> str:
    return (rig.state_dir / "instances" / str(instance_uuid) / "console.log").read_text()


def outcomes(rig: Rig, instance_uuid: UUID) -> list[tuple[PowerAction, bool]]:
    return [
        (r.action, r.success)
        for r in rig.conductor.action_results
        if r.instance_uuid == instance_uuid
    ]


async def built(rig: Rig) -> UUID:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    return spec.uuid


async def test_pause_and_unpause_report_each_step(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await rig.compute.pause_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: outcomes(rig, guest) == [(PowerAction.PAUSE, True)])
        assert power(rig, guest) == "paused"
        await rig.compute.unpause_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest)[1] == (PowerAction.UNPAUSE, True)
        assert power(rig, guest) == "running"
        assert "unpaused" in console(rig, guest)


async def test_suspend_and_resume_report_each_step(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await rig.compute.suspend_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: outcomes(rig, guest) == [(PowerAction.SUSPEND, True)])
        assert power(rig, guest) == "suspended"
        await rig.compute.resume_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest)[1] == (PowerAction.RESUME, True)
        assert power(rig, guest) == "running"


async def test_twin_pauses_delivered_at_once_pause_once(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await asyncio.gather(
            rig.compute.pause_instance(CTX, rig.service_uuid, guest),
            rig.compute.pause_instance(CTX, rig.service_uuid, guest),
        )
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest) == [(PowerAction.PAUSE, True)] * 2
        assert power(rig, guest) == "paused"
        assert console(rig, guest).count("paused") == 1


async def test_twin_resumes_delivered_at_once_resume_once(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await rig.compute.suspend_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 1)
        await asyncio.gather(
            rig.compute.resume_instance(CTX, rig.service_uuid, guest),
            rig.compute.resume_instance(CTX, rig.service_uuid, guest),
        )
        await eventually(lambda: len(outcomes(rig, guest)) == 3)
        assert power(rig, guest) == "running"
        assert console(rig, guest).count("resumed") == 1


async def test_a_pause_that_fails_once_is_reported_and_works_when_asked_again(
    tmp_path: Path,
) -> None:
    async with _rig(PausesOnSecondTry(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await rig.compute.pause_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 1)
        [failure] = [r for r in rig.conductor.action_results if r.instance_uuid == guest]
        assert (failure.success, failure.message) == (False, "the monitor was busy")
        assert power(rig, guest) == "running"
        await rig.compute.pause_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest)[1] == (PowerAction.PAUSE, True)
        assert power(rig, guest) == "paused"


async def test_unpause_of_a_shut_off_guest_fails_and_changes_nothing(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        guest = await built(rig)
        await rig.compute.stop_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 1)
        await rig.compute.resume_instance(CTX, rig.service_uuid, guest)
        await eventually(lambda: len(outcomes(rig, guest)) == 2)
        assert outcomes(rig, guest)[1] == (PowerAction.RESUME, False)
        assert power(rig, guest) == "shutdown"


async def test_the_agent_tells_its_hosts_uptime_twice_alike(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        first, second = await asyncio.gather(
            rig.compute.get_host_uptime(CTX, rig.service_uuid),
            rig.compute.get_host_uptime(CTX, rig.service_uuid),
        )
    assert " up " in first
    assert "load average" in second


def test_the_uptime_line_reads_as_uptime_prints_it(tmp_path: Path) -> None:
    noon = time.struct_time((2026, 1, 2, 12, 0, 5, 4, 2, 0))
    line = format_uptime(noon, 93 * 86400 + 18 * 3600 + 25 * 60, (0.2, 0.12, 0.14))
    assert line == " 12:00:05 up 93 days, 18:25,  load average: 0.20, 0.12, 0.14"
    assert format_uptime(noon, 300, (0, 0, 0)).startswith(" 12:00:05 up 5 min,")
    fake = tmp_path / "uptime"
    fake.write_text("3661.5 100.0\n")
    assert " up 1:01," in host_uptime(fake)
