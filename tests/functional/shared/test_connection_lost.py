"""The RabbitMQ transport tells who asked each time its broker connection is lost.

A compute agent needs it: after any loss of its connection it reconciles its guests
before it starts one (``services/compute/fencing.py``). The broker is reached through a
proxy the test cuts, as a network cut that resets the connection would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from devkit.servers import AMQP_URL
from shared.rpc.amqp import AmqpTransport
from tests.faults.proxy import TcpProxy, url_through
from tests.polling import wait_until

pytestmark = pytest.mark.functional


@pytest.fixture
async def transport(amqp_proxy: TcpProxy, exchange: str) -> AsyncIterator[AmqpTransport]:
    amqp = AmqpTransport(
        url_through(AMQP_URL, amqp_proxy.address), exchange, queue_expires=60, connect_timeout=10
    )
    await amqp.connect()
    yield amqp
    await amqp.close()


async def test_each_loss_of_the_connection_is_told_to_every_listener(
    transport: AmqpTransport, amqp_proxy: TcpProxy
) -> None:
    heard: list[str] = []
    also: list[str] = []
    transport.on_connection_lost(heard.append)
    transport.on_connection_lost(also.append)

    for times in (1, 2):
        await amqp_proxy.cut()

        async def told(times: int = times) -> bool:
            return len(heard) == times

        await wait_until(told, what=f"loss {times} told", timeout=20)
        await amqp_proxy.restore()

        async def back() -> bool:
            return transport.node is not None

        await wait_until(back, what="the connection back", timeout=20)

    assert len(also) == 2
    assert all(reason for reason in heard)
    password = urlsplit(AMQP_URL).password or "guest"
    assert f":{password}@" not in " ".join(heard)
