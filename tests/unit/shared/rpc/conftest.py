"""Two fake transports on one in-memory broker: a serving process and a calling one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.rpc.fake import FakeBroker, FakeTransport


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
async def server_transport(broker: FakeBroker) -> AsyncIterator[FakeTransport]:
    transport = FakeTransport(broker)
    await transport.connect()
    yield transport
    await transport.close()


@pytest.fixture
async def client_transport(broker: FakeBroker) -> AsyncIterator[FakeTransport]:
    transport = FakeTransport(broker)
    await transport.connect()
    yield transport
    await transport.close()
