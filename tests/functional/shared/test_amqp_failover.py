"""The RabbitMQ transport on a URL naming two nodes: it leaves a lost node for the other.

The two "nodes" are two proxies in front of the test broker, so a test can take one away
(:meth:`~tests.faults.proxy.TcpProxy.cut`) as a node's death would: its connections drop
and new ones are refused. What matters here is the transport's side: it connects to the
other node at once, attaches its consumers again, sends again what the broker had not
confirmed, and fails a call whose reply queue went with the connection without waiting
for the call's timeout. (Real three-node clusters are in ``tests/ha``.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import pytest
from pydantic import BaseModel

from shared.context import RequestContext
from shared.exceptions import ReplyQueueLost
from shared.rpc.amqp import AmqpTransport
from shared.rpc.client import RPCClient
from shared.rpc.server import RPCServer
from tests.broker import remove_exchange
from tests.faults.proxy import TcpProxy
from tests.polling import wait_until

pytestmark = pytest.mark.functional

TOPIC = "failover"
VERSION = "1.0"
SOON = 10.0


class Text(BaseModel):
    text: str


class Nothing(BaseModel):
    pass


class Endpoint:
    def __init__(self) -> None:
        self.noted: list[str] = []
        self.held = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def echo(self, ctx: RequestContext, req: Text) -> Text:
        return req

    async def note(self, ctx: RequestContext, req: Text) -> None:
        self.noted.append(req.text)

    async def hold(self, ctx: RequestContext, req: Nothing) -> Text:
        self.held += 1
        self.entered.set()
        async with asyncio.timeout(SOON * 3):
            await self.release.wait()
        return Text(text="released")


@pytest.fixture
async def nodes(amqp_url: str) -> AsyncIterator[dict[str, TcpProxy]]:
    """Two proxies to the test broker, by ``host:port``."""
    target = urlsplit(amqp_url)
    proxies = [TcpProxy(target.hostname or "127.0.0.1", target.port or 5672) for _ in range(2)]
    for proxy in proxies:
        await proxy.start()
    yield {proxy.address: proxy for proxy in proxies}
    for proxy in proxies:
        await proxy.close()


@pytest.fixture
def cluster_url(nodes: dict[str, TcpProxy]) -> str:
    return f"amqp://guest:guest@{','.join(nodes)}/"


@pytest.fixture
async def direct(amqp_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    """A transport on the broker itself, which no test takes away."""
    transport = AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=SOON)
    await transport.connect()
    yield transport
    await transport.close()
    await remove_exchange(exchange, (TOPIC,))


@pytest.fixture
async def clustered(cluster_url: str, exchange: str) -> AsyncIterator[AmqpTransport]:
    """A transport given both nodes."""
    transport = AmqpTransport(cluster_url, exchange, queue_expires=60, connect_timeout=SOON)
    await transport.connect()
    yield transport
    await transport.close()


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint()


async def serve(transport: AmqpTransport, endpoint: Endpoint) -> RPCServer:
    server = RPCServer(transport, TOPIC, endpoint, version=VERSION)
    await server.start(prefetch=4)
    return server


def client(transport: AmqpTransport, timeout: float = SOON) -> RPCClient:
    return RPCClient(transport, TOPIC, version_cap=VERSION, timeout=timeout)


async def until(check: Callable[[], bool], what: str) -> None:
    async def holds() -> bool:
        return check()

    await wait_until(holds, what=what, timeout=SOON, interval=0.02)


async def test_a_lost_node_is_left_for_the_other_and_the_consumer_attaches_again(
    nodes: dict[str, TcpProxy],
    clustered: AmqpTransport,
    direct: AmqpTransport,
    endpoint: Endpoint,
) -> None:
    ctx = RequestContext()
    await serve(clustered, endpoint)
    first = clustered.node
    assert first in nodes

    await nodes[first].cut()
    await until(lambda: clustered.node not in (None, first), "a connection to the other node")

    # The consumer attached again there: calls and casts from elsewhere are served.
    answer = await client(direct).call(ctx, "echo", Text(text="hi"), version=VERSION, returns=Text)
    assert answer.text == "hi"
    await client(direct).cast(ctx, "note", Text(text="after"), version=VERSION)
    await until(lambda: endpoint.noted == ["after"], "the cast handled")
    assert clustered.broker is not None
    assert clustered.broker.connections == 2


async def test_a_call_whose_reply_queue_goes_with_its_node_fails_at_once(
    nodes: dict[str, TcpProxy],
    clustered: AmqpTransport,
    direct: AmqpTransport,
    endpoint: Endpoint,
) -> None:
    await serve(direct, endpoint)
    call = asyncio.create_task(
        client(clustered, timeout=60).call(
            RequestContext(), "hold", Nothing(), version=VERSION, returns=Text
        )
    )
    await asyncio.wait_for(endpoint.entered.wait(), SOON)
    assert clustered.node is not None

    cut_at = time.monotonic()
    await nodes[clustered.node].cut()
    with pytest.raises(ReplyQueueLost, match="reply queue"):
        await call
    assert time.monotonic() - cut_at < 1.0


async def test_a_cast_the_broker_had_not_confirmed_is_sent_again_on_the_other_node(
    nodes: dict[str, TcpProxy],
    clustered: AmqpTransport,
    direct: AmqpTransport,
    endpoint: Endpoint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await serve(direct, endpoint)
    first = clustered.node
    assert first is not None
    # The cast reaches the broker; its confirm never comes back; the node goes away.
    nodes[first].cut_after(b"unconfirmed-cast")

    await client(clustered).cast(
        RequestContext(), "note", Text(text="unconfirmed-cast"), version=VERSION
    )

    assert clustered.node not in (None, first)
    await until(lambda: "unconfirmed-cast" in endpoint.noted, "the cast handled")
    # Delivered at least once; twice when the first copy had reached the queue.
    assert set(endpoint.noted) == {"unconfirmed-cast"}
    assert any("sending it again" in record.getMessage() for record in caplog.records)


async def test_a_call_the_broker_had_not_confirmed_is_sent_again_and_answered(
    nodes: dict[str, TcpProxy],
    clustered: AmqpTransport,
    direct: AmqpTransport,
    endpoint: Endpoint,
) -> None:
    await serve(direct, endpoint)
    first = clustered.node
    assert first is not None
    nodes[first].cut_after(b"unconfirmed-call")

    answer = await client(clustered).call(
        RequestContext(), "echo", Text(text="unconfirmed-call"), version=VERSION, returns=Text
    )

    assert answer.text == "unconfirmed-call"
    assert clustered.node not in (None, first)
