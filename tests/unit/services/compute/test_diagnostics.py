"""``get_instance_diagnostics`` behind the agent's RPC topic, and the drivers' answers."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from uuid import UUID

import pytest

from services.api.http.microversion import APIVersion
from services.api.servers.diagnostics import diagnostics_view
from services.compute.rpcapi import GuestDiagnostics
from services.compute.virt.fake import FakeDriver
from services.compute.virt.local import LocalDriver
from shared.context import RequestContext
from shared.exceptions import GuestNotFound, KeelError
from shared.objects.network import FixedIp
from tests.unit.services.compute.standin import eventually, make_spec
from tests.unit.services.compute.test_manager import Rig, _rig


class FailsOnce(LocalDriver):
    """A hypervisor that cannot answer the first time (its monitor busy, say)."""

    failed = False

    async def diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        if not self.failed:
            self.failed = True
            raise KeelError("the monitor was busy")
        return await super().diagnostics(instance_uuid)


async def _built(rig: Rig) -> UUID:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    return spec.uuid


async def _ask(rig: Rig, instance_uuid: UUID) -> GuestDiagnostics:
    return await rig.compute.get_instance_diagnostics(
        RequestContext(), rig.service_uuid, instance_uuid
    )


async def test_twin_requests_at_once_both_get_the_guests_diagnostics(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        instance_uuid = await _built(rig)
        first, second = await asyncio.gather(_ask(rig, instance_uuid), _ask(rig, instance_uuid))
        with pytest.raises(GuestNotFound):
            await _ask(rig, uuid.uuid4())
    assert first.state == second.state == "running"
    assert (first.driver, first.hypervisor) == ("libvirt", "local")
    assert len(first.cpu_details) == 1
    assert first.memory_details.maximum == 512
    assert first.uptime is not None


async def test_a_driver_that_fails_once_is_an_error_then_answers(tmp_path: Path) -> None:
    async with _rig(FailsOnce(tmp_path, "host1")) as rig:
        instance_uuid = await _built(rig)
        with pytest.raises(KeelError, match="monitor was busy"):
            await _ask(rig, instance_uuid)
        assert (await _ask(rig, instance_uuid)).state == "running"


async def test_a_stopped_local_guest_has_no_uptime_and_uses_no_memory(tmp_path: Path) -> None:
    driver = LocalDriver(tmp_path, "host1")
    spec = make_spec()
    await driver.spawn(spec)
    await driver.power_off(spec.uuid)
    found = await driver.diagnostics(spec.uuid)
    assert (found.state, found.uptime, found.memory_details.used) == ("shutdown", None, 0)


async def test_the_fake_drivers_nics_are_the_guests_addresses() -> None:
    driver = FakeDriver("host1")
    address = FixedIp(
        network_id=uuid.uuid4(), network_name="private", address="10.0.0.5", mac="02:00:0a:00:00:05"
    )
    spec = make_spec().model_copy(update={"addresses": [address]})
    await driver.spawn(spec)
    await driver.pause(spec.uuid)
    found = await driver.diagnostics(spec.uuid)
    assert found.state == "paused"
    assert [nic.mac_address for nic in found.nic_details] == ["02:00:0a:00:00:05"]


def test_the_view_is_standard_from_2_48_and_flat_below() -> None:
    found = GuestDiagnostics(state="running", driver="libvirt")
    standard = diagnostics_view(found, APIVersion.parse("2.48"))
    assert (standard["num_cpus"], standard["state"], standard["config_drive"]) == (
        0,
        "running",
        False,
    )
    legacy = diagnostics_view(found, APIVersion.parse("2.47"))
    assert "state" not in legacy
    assert legacy["memory"] == 0
