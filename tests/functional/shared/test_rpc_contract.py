"""The RPC contract, run against both transports: in memory and real RabbitMQ.

Every test runs twice: once on two :class:`FakeTransport` objects sharing a broker, once
on two :class:`AmqpTransport` objects on the test's own exchange. The first transport of
the pair serves, the second calls, as two keel processes would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

import pytest
from pydantic import BaseModel

from shared.context import RequestContext
from shared.exceptions import (
    MessagingTimeout,
    NoSuchMethod,
    NoValidHost,
    RemoteError,
    Unroutable,
    UnsupportedVersion,
)
from shared.rpc.amqp import AmqpTransport
from shared.rpc.client import RPCClient
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.rpc.server import RPCServer
from shared.rpc.transport import DeadLetter, Transport
from tests.broker import remove_exchange

pytestmark = pytest.mark.functional

TOPIC = "contract"
SERVER_VERSION = "1.2"
#: Bound on waiting for something that should happen almost at once.
SOON = 10.0


class Text(BaseModel):
    text: str


class Answer(BaseModel):
    text: str
    server: str


class Failure(BaseModel):
    kind: Literal["no_valid_host", "value_error"]


class Nothing(BaseModel):
    pass


class Endpoint:
    """A small RPC API with one method per behaviour under test."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.noted: list[str] = []
        self.note_arrived = asyncio.Event()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False

    async def echo(self, ctx: RequestContext, req: Text) -> Answer:
        return Answer(text=req.text, server=self.name)

    async def note(self, ctx: RequestContext, req: Text) -> None:
        self.noted.append(req.text)
        self.note_arrived.set()

    async def fail(self, ctx: RequestContext, req: Failure) -> None:
        if req.kind == "no_valid_host":
            raise NoValidHost("every host is full")
        raise ValueError("the handler tripped")

    async def hold(self, ctx: RequestContext, req: Nothing) -> Answer:
        self.entered.set()
        async with asyncio.timeout(SOON * 3):
            await self.release.wait()
        self.finished = True
        return Answer(text="released", server=self.name)

    async def busy(self, ctx: RequestContext, req: Nothing) -> Answer:
        await asyncio.sleep(0.05)
        return Answer(text="done", server=self.name)


@pytest.fixture(params=["fake", "amqp"])
async def transports(
    request: pytest.FixtureRequest, amqp_url: str, exchange: str
) -> AsyncIterator[tuple[Transport, Transport]]:
    pair: tuple[Transport, Transport]
    if request.param == "fake":
        broker = FakeBroker()
        pair = (FakeTransport(broker), FakeTransport(broker))
    else:
        pair = (
            AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10),
            AmqpTransport(amqp_url, exchange, queue_expires=60, connect_timeout=10),
        )
    for transport in pair:
        await transport.connect()
    yield pair
    for transport in pair:
        await transport.close()
    if request.param == "amqp":
        await remove_exchange(exchange, (TOPIC,))


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint("first")


@pytest.fixture
async def server(
    transports: tuple[Transport, Transport], endpoint: Endpoint
) -> AsyncIterator[RPCServer]:
    server = RPCServer(transports[0], TOPIC, endpoint, version=SERVER_VERSION)
    await server.start(prefetch=4)
    yield server
    endpoint.release.set()
    await server.stop(drain_timeout=SOON)


@pytest.fixture
def client(transports: tuple[Transport, Transport], server: RPCServer) -> RPCClient:
    return RPCClient(transports[1], TOPIC, version_cap=SERVER_VERSION, timeout=SOON)


@pytest.fixture
def ctx() -> RequestContext:
    return RequestContext(user_id="u1", project_id="p1")


async def _dead_letters(transport: Transport, want: int = 1) -> list[DeadLetter]:
    """Poll the dead-letter queue until ``want`` casts arrived (rejection is async)."""
    async with asyncio.timeout(SOON):
        while True:
            found = await transport.dead_letters()
            if len(found) >= want:
                return found
            await asyncio.sleep(0.05)


async def test_call_returns_the_typed_result(client: RPCClient, ctx: RequestContext) -> None:
    answer = await client.call(ctx, "echo", Text(text="hello"), version="1.0", returns=Answer)
    assert answer == Answer(text="hello", server="first")
    at_cap = await client.call(ctx, "echo", Text(text="again"), version="1.2", returns=Answer)
    assert at_cap.text == "again"


async def test_cast_is_handled(client: RPCClient, endpoint: Endpoint, ctx: RequestContext) -> None:
    await client.cast(ctx, "note", Text(text="remember me"), version="1.1")
    async with asyncio.timeout(SOON):
        await endpoint.note_arrived.wait()
    assert endpoint.noted == ["remember me"]


async def test_call_without_reply_in_time_times_out(
    client: RPCClient, endpoint: Endpoint, ctx: RequestContext
) -> None:
    with pytest.raises(MessagingTimeout):
        await client.call(ctx, "hold", Nothing(), version="1.0", returns=Answer, timeout=0.5)
    assert endpoint.entered.is_set()


@pytest.mark.timeout(15)
async def test_call_to_a_topic_nobody_serves_fails_at_once(
    client: RPCClient, ctx: RequestContext
) -> None:
    nobody = client.for_topic("nobody-serves-this")
    with pytest.raises(Unroutable):
        await nobody.call(ctx, "echo", Text(text="?"), version="1.0", returns=Answer, timeout=30)
    with pytest.raises(Unroutable):
        await nobody.cast(ctx, "note", Text(text="?"), version="1.0")


async def test_business_error_comes_back_typed(client: RPCClient, ctx: RequestContext) -> None:
    with pytest.raises(NoValidHost) as caught:
        await client.call(ctx, "fail", Failure(kind="no_valid_host"), version="1.0")
    assert "every host is full" in caught.value.message


async def test_unexpected_error_comes_back_as_remote_error(
    client: RPCClient, ctx: RequestContext
) -> None:
    with pytest.raises(RemoteError) as caught:
        await client.call(ctx, "fail", Failure(kind="value_error"), version="1.0")
    assert caught.value.exc_type == "ValueError"
    assert "the handler tripped" in caught.value.remote_message


@pytest.mark.parametrize(("cap", "version"), [("1.5", "1.5"), ("2.0", "2.0")])
async def test_newer_version_is_unsupported(
    client: RPCClient, ctx: RequestContext, cap: str, version: str
) -> None:
    newer = RPCClient(client.transport, TOPIC, version_cap=cap, timeout=SOON)
    with pytest.raises(UnsupportedVersion) as caught:
        await newer.call(ctx, "echo", Text(text="hi"), version=version, returns=Answer)
    assert not isinstance(caught.value, NoSuchMethod)
    assert SERVER_VERSION in caught.value.message


async def test_unknown_method_is_no_such_method(client: RPCClient, ctx: RequestContext) -> None:
    with pytest.raises(NoSuchMethod) as caught:
        await client.call(ctx, "reticulate", Text(text="hi"), version="1.0")
    assert not isinstance(caught.value, UnsupportedVersion)
    assert "reticulate" in caught.value.message


async def test_malformed_message_is_dead_lettered_and_serving_goes_on(
    client: RPCClient, transports: tuple[Transport, Transport], ctx: RequestContext
) -> None:
    garbage = b"\x00\xffthis is not an envelope"
    await transports[1].cast(TOPIC, garbage, message_id="garbage-1")
    [dead] = await _dead_letters(transports[1])
    assert (dead.body, dead.topic, dead.kind, dead.reason) == (garbage, TOPIC, "cast", "rejected")
    assert "malformed envelope" in dead.detail
    # Looking does not take it away; purging does.
    assert [d.body for d in await transports[1].dead_letters()] == [garbage]
    assert await transports[1].purge_dead_letters() == 1
    assert await transports[1].dead_letters() == []
    answer = await client.call(ctx, "echo", Text(text="still here"), version="1.0", returns=Answer)
    assert answer.text == "still here"


async def test_competing_consumers_share_the_work(
    client: RPCClient, transports: tuple[Transport, Transport], ctx: RequestContext
) -> None:
    second = RPCServer(transports[1], TOPIC, Endpoint("second"), version=SERVER_VERSION)
    await second.start(prefetch=4)
    try:
        answers = await asyncio.gather(
            *(client.call(ctx, "busy", Nothing(), version="1.0", returns=Answer) for _ in range(16))
        )
    finally:
        await second.stop(drain_timeout=SOON)
    assert {answer.server for answer in answers} == {"first", "second"}


async def test_stop_drains_the_message_in_flight(
    client: RPCClient, server: RPCServer, endpoint: Endpoint, ctx: RequestContext
) -> None:
    call = asyncio.create_task(client.call(ctx, "hold", Nothing(), version="1.0", returns=Answer))
    async with asyncio.timeout(SOON):
        await endpoint.entered.wait()
    stopping = asyncio.create_task(server.stop(drain_timeout=SOON * 3))
    await asyncio.sleep(0.2)
    assert not stopping.done(), "stop returned while a handler was still running"
    endpoint.release.set()
    await stopping
    assert endpoint.finished
    assert (await call).text == "released"
    with pytest.raises(MessagingTimeout):
        await client.call(ctx, "echo", Text(text="late"), version="1.0", timeout=0.5)
