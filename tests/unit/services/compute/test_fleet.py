"""keel-fleet's pieces without a broker: shared transport views and per-agent settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.compute.fleet import FleetSpec, SharedTransport, agent_settings
from shared.config import Settings
from shared.rpc.fake import FakeTransport
from shared.rpc.transport import IncomingMessage, Settle, Settlement


class Counting:
    def __init__(self) -> None:
        self.seen = 0

    async def __call__(self, message: IncomingMessage) -> Settlement:
        self.seen += 1
        return Settlement(Settle.ACK)


async def test_closing_one_agents_view_stops_only_its_consumers() -> None:
    shared = FakeTransport()
    await shared.connect()
    first, second = SharedTransport(shared), SharedTransport(shared)
    await first.connect()
    await second.connect()
    one, two = Counting(), Counting()
    await first.serve("compute.one", one, prefetch=4)
    await second.serve("compute.two", two, prefetch=4)

    await first.close()
    await second.cast("compute.one", b"{}", message_id="m1")
    await first.cast("compute.two", b"{}", message_id="m2")
    await asyncio.sleep(0.05)

    assert (one.seen, two.seen) == (0, 1)
    await second.close()
    await shared.close()


def test_each_agent_gets_its_own_host_state_dir_and_fake_driver(tmp_path: Path) -> None:
    settings = Settings(host="controller", state_dir=tmp_path / "ignored")
    spec = FleetSpec(hosts=3, prefix="rehearsal", state_dir=tmp_path, vcpus=8, memory_mb=4096)
    third = agent_settings(settings, spec, 2)
    assert third.host == "rehearsal-00003"
    assert third.state_dir == tmp_path / "rehearsal-00003"
    assert (third.compute.driver, third.compute.vcpus, third.compute.memory_mb) == (
        "fake",
        8,
        4096,
    )
    assert settings.host == "controller"
