"""``get_console_output`` behind the agent's RPC topic, on the fake broker."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from uuid import UUID

import pytest

from services.compute.manager import tail_lines
from services.compute.rpcapi import ComputeAPI
from services.compute.virt.local import LocalDriver
from shared.context import RequestContext
from shared.exceptions import ConsoleNotAvailable, GuestNotFound, ServiceTooOld
from tests.unit.services.compute.standin import eventually, make_spec
from tests.unit.services.compute.test_manager import Rig, _rig


class ReadFailsOnce(LocalDriver):
    """A console log that cannot be read the first time (rotated under the reader, say)."""

    failed = False

    async def console_output(self, instance_uuid: UUID) -> bytes:
        if not self.failed:
            self.failed = True
            raise ConsoleNotAvailable(f"the console log of {instance_uuid} cannot be read")
        return await super().console_output(instance_uuid)


class SlowRead(LocalDriver):
    reads = 0

    async def console_output(self, instance_uuid: UUID) -> bytes:
        self.reads += 1
        await asyncio.sleep(0.1)
        return await super().console_output(instance_uuid)


async def _built(rig: Rig) -> UUID:
    spec = make_spec()
    await rig.build(spec)
    await eventually(lambda: bool(rig.conductor.results_for(spec.uuid)))
    return spec.uuid


async def _console(rig: Rig, instance_uuid: UUID, tail: int | None = None) -> str:
    return await rig.compute.get_console_output(
        RequestContext(), rig.service_uuid, instance_uuid, tail_length=tail
    )


async def test_console_output_is_the_guest_log_and_its_last_lines(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        instance_uuid = await _built(rig)

        whole = await _console(rig, instance_uuid)
        last_ten = await _console(rig, instance_uuid, 10)

    assert f"keel-guest-up {instance_uuid}" in whole
    assert len(last_ten.split("\n")) == 10
    assert whole.endswith(last_ten)


async def test_twin_console_requests_at_once_both_get_the_log(tmp_path: Path) -> None:
    async with _rig(SlowRead(tmp_path, "host1")) as rig:
        instance_uuid = await _built(rig)

        first, second = await asyncio.gather(
            _console(rig, instance_uuid), _console(rig, instance_uuid)
        )

    assert first == second
    assert f"keel-guest-up {instance_uuid}" in first


async def test_console_request_redelivered_after_a_lost_connection_is_answered(
    tmp_path: Path,
) -> None:
    driver = SlowRead(tmp_path, "host1")
    async with _rig(driver) as rig:
        instance_uuid = await _built(rig)
        asking = asyncio.create_task(_console(rig, instance_uuid))
        await eventually(lambda: driver.reads == 1)
        # The agent's broker connection drops while it reads: the broker delivers the
        # call again, and the reading is simply done again.
        rig.agent_side.lose_connection()

        output = await asyncio.wait_for(asking, 10)

    assert driver.reads >= 2
    assert f"keel-guest-up {instance_uuid}" in output


async def test_a_read_that_fails_once_is_an_error_then_works(tmp_path: Path) -> None:
    async with _rig(ReadFailsOnce(tmp_path, "host1")) as rig:
        instance_uuid = await _built(rig)

        with pytest.raises(ConsoleNotAvailable, match="cannot be read"):
            await _console(rig, instance_uuid)
        output = await _console(rig, instance_uuid)

    assert f"keel-guest-up {instance_uuid}" in output


async def test_console_of_a_guest_not_on_the_host_is_guest_not_found(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        with pytest.raises(GuestNotFound):
            await _console(rig, uuid.uuid4())


async def test_an_agent_older_than_1_4_is_never_asked(tmp_path: Path) -> None:
    async with _rig(LocalDriver(tmp_path, "host1")) as rig:
        old = ComputeAPI(rig.compute.client.transport, version_cap="1.3")
        with pytest.raises(ServiceTooOld, match=r"get_console_output needs compute RPC 1\.4"):
            await old.get_console_output(RequestContext(), rig.service_uuid, uuid.uuid4())


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (None, b"a\nb\nc\n"),
        (0, b""),
        (1, b""),
        (2, b"c\n"),
        (3, b"b\nc\n"),
        (10, b"a\nb\nc\n"),
    ],
)
def test_tail_lines_cuts_as_nova_does(count: int | None, expected: bytes) -> None:
    assert tail_lines(b"a\nb\nc\n", count) == expected
