"""keel's RPC on a real three-node RabbitMQ cluster whose nodes die.

Topic queues are quorum queues with a replica on each node; when the node leading one
is killed, the queue elects another leader and keeps serving: consumers on the
surviving nodes carry on (the broker may cancel them; they attach again), consumers
connected to the dead node connect to another and attach there. A caller whose own
node dies learns at once that its reply queue went with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from pydantic import BaseModel

from devkit.rabbit_cluster import RabbitCluster, RabbitNode
from devkit.readiness import wait_until
from shared.context import RequestContext
from shared.exceptions import ReplyQueueLost
from shared.rpc.amqp import AmqpTransport
from shared.rpc.client import RPCClient
from shared.rpc.server import RPCServer

pytestmark = [pytest.mark.ha, pytest.mark.timeout(300)]

TOPIC = "ha-rpc"
VERSION = "1.0"
SOON = 20.0


class Text(BaseModel):
    text: str


class Nothing(BaseModel):
    pass


class Endpoint:
    def __init__(self) -> None:
        self.noted: list[str] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def echo(self, ctx: RequestContext, req: Text) -> Text:
        return req

    async def note(self, ctx: RequestContext, req: Text) -> None:
        self.noted.append(req.text)

    async def hold(self, ctx: RequestContext, req: Nothing) -> Text:
        self.entered.set()
        async with asyncio.timeout(SOON * 3):
            await self.release.wait()
        return Text(text="released")


def nodes_url(rabbit: RabbitCluster, nodes: list[RabbitNode]) -> str:
    return f"amqp://guest:guest@{','.join(node.address for node in nodes)}/"


@pytest.fixture
async def transports(
    cluster_exchange: str,
) -> AsyncIterator[Callable[[str], AmqpTransport]]:
    """Connected transports on the test's exchange, closed afterwards."""
    made: list[AmqpTransport] = []

    def make(url: str) -> AmqpTransport:
        transport = AmqpTransport(url, cluster_exchange, queue_expires=120, connect_timeout=SOON)
        made.append(transport)
        return transport

    yield make
    for transport in made:
        await transport.close()


async def connected(transport: AmqpTransport) -> AmqpTransport:
    await transport.connect()
    return transport


def client(transport: AmqpTransport, timeout: float = SOON) -> RPCClient:
    return RPCClient(transport, TOPIC, version_cap=VERSION, timeout=timeout)


async def answered(transport: AmqpTransport) -> bool:
    """An echo call is answered (the topic's queue has a leader and a consumer)."""
    answer = await client(transport).call(
        RequestContext(), "echo", Text(text="ping"), version=VERSION, returns=Text
    )
    return answer.text == "ping"


async def test_a_topic_queue_has_a_replica_on_each_node_and_outlives_its_leader(
    rabbit: RabbitCluster,
    cluster_exchange: str,
    transports: Callable[[str], AmqpTransport],
) -> None:
    endpoint = Endpoint()
    server = await connected(transports(rabbit.url()))
    await RPCServer(server, TOPIC, endpoint, version=VERSION).start()
    caller = await connected(transports(rabbit.url()))
    queue = server.topology.queue_name(TOPIC)
    assert await rabbit.members(queue) == sorted(node.name for node in rabbit.nodes)
    leader = await rabbit.leader(queue)

    await rabbit.kill(leader)

    assert (await rabbit.leader(queue)) != leader
    assert await answered(caller)
    await client(caller).cast(RequestContext(), "note", Text(text="after"), version=VERSION)

    async def noted() -> bool:
        return endpoint.noted == ["after"]

    await wait_until(noted, what="the cast handled", timeout=SOON)
    # The same transports, moved off the dead node where they were on it.
    assert server.node != leader.address
    assert caller.node != leader.address


async def test_a_consumer_outlives_its_queue_leader_on_another_node(
    rabbit: RabbitCluster,
    transports: Callable[[str], AmqpTransport],
) -> None:
    first, second, third = rabbit.nodes
    # Declared from the second node, the queue is led from there; the consumer is on
    # the first node and stays connected while the leader dies.
    declarer = await connected(transports(nodes_url(rabbit, [second])))
    await declarer.topology.ensure_topic_queue(await declarer._connection(), TOPIC)
    queue = declarer.topology.queue_name(TOPIC)
    leader = await rabbit.leader(queue)
    assert leader in (second, first, third)
    survivors = [node for node in rabbit.nodes if node is not leader]
    server = await connected(transports(nodes_url(rabbit, [survivors[0]])))
    endpoint = Endpoint()
    await RPCServer(server, TOPIC, endpoint, version=VERSION).start()
    caller = await connected(transports(nodes_url(rabbit, [survivors[1]])))
    assert await answered(caller)
    connections = server.broker.connections if server.broker else 0

    await rabbit.kill(leader)

    async def served() -> bool:
        try:
            return await answered(caller)
        except Exception:
            return False

    await wait_until(served, what="a call answered after the leader died", timeout=SOON)
    assert server.node == survivors[0].address
    assert server.broker is not None
    assert server.broker.connections == connections


async def test_a_call_whose_reply_queue_dies_with_its_node_fails_within_a_second(
    rabbit: RabbitCluster,
    transports: Callable[[str], AmqpTransport],
) -> None:
    first, second, third = rabbit.nodes
    endpoint = Endpoint()
    server = await connected(transports(nodes_url(rabbit, [first])))
    await RPCServer(server, TOPIC, endpoint, version=VERSION).start()
    caller = await connected(transports(nodes_url(rabbit, [second, third])))
    call = asyncio.create_task(
        client(caller, timeout=120).call(
            RequestContext(), "hold", Nothing(), version=VERSION, returns=Text
        )
    )
    await asyncio.wait_for(endpoint.entered.wait(), SOON)
    # The server may see the call before RabbitMQ's confirm reaches the caller; a call
    # whose publish was not confirmed when its connection went is sent again (another
    # case, another outcome). Give the confirm time to arrive.
    await asyncio.sleep(1.0)
    assert caller.node is not None
    dying = rabbit.by_address(caller.node)

    killed_at = time.monotonic()
    await rabbit.kill(dying)
    with pytest.raises(ReplyQueueLost, match="reply queue"):
        await call
    assert time.monotonic() - killed_at < 1.0

    # The caller is on the other node now and its calls are answered again.
    endpoint.release.set()

    async def served() -> bool:
        try:
            return await answered(caller)
        except Exception:
            return False

    await wait_until(served, what="a call answered on the other node", timeout=SOON)
    assert caller.node not in (None, dying.address)


async def test_casts_go_on_when_the_publisher_dies_with_the_queue_leader(
    rabbit: RabbitCluster,
    transports: Callable[[str], AmqpTransport],
) -> None:
    """The publisher's node leads the queue; both die at once. RabbitMQ refuses the first
    publishes on the new node (nack) while the queue elects a leader, and may go on
    refusing on a channel opened meanwhile: keel sends again on a new channel."""
    publisher = await connected(transports(rabbit.url()))
    assert publisher.node is not None
    doomed = rabbit.by_address(publisher.node)
    declarer = await connected(transports(nodes_url(rabbit, [doomed])))
    await declarer.topology.ensure_topic_queue(await declarer._connection(), TOPIC)
    assert await rabbit.leader(declarer.topology.queue_name(TOPIC)) == doomed
    others = [node for node in rabbit.nodes if node is not doomed]
    endpoint = Endpoint()
    server = await connected(transports(nodes_url(rabbit, others)))
    await RPCServer(server, TOPIC, endpoint, version=VERSION).start()
    sent: list[str] = []

    async def keep_casting() -> None:
        for number in range(60):
            text = f"cast-{number}"
            await client(publisher).cast(RequestContext(), "note", Text(text=text), version=VERSION)
            sent.append(text)
            await asyncio.sleep(0.05)

    casting = asyncio.create_task(keep_casting())
    await wait_until(as_check(lambda: len(sent) >= 10), what="casts going out", timeout=SOON)
    await rabbit.kill(doomed)
    await casting  # no cast failed

    async def all_handled() -> bool:
        return set(sent) <= set(endpoint.noted)

    await wait_until(all_handled, what="every cast handled", timeout=SOON)
    assert len(sent) == 60
    assert publisher.node != doomed.address


def as_check(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def holds() -> bool:
        return check()

    return holds
