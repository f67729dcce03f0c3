"""RPCServer dispatch on the fake transport: routing, validation, errors, deadlines."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel

from shared.context import RequestContext, current_request_id
from shared.exceptions import (
    InstanceNotFound,
    InvalidMessage,
    MessagingTimeout,
    NoSuchMethod,
    RemoteError,
)
from shared.rpc.client import RPCClient
from shared.rpc.envelope import Envelope, Reply
from shared.rpc.fake import FakeTransport
from shared.rpc.server import RPCServer
from shared.rpc.transport import IncomingMessage, RejectMessage

TOPIC = "unit"


class Greeting(BaseModel):
    name: str


class Greeted(BaseModel):
    text: str
    request_id: str | None


class Endpoint:
    def __init__(self) -> None:
        self.handled: list[str] = []

    async def greet(self, ctx: RequestContext, req: Greeting) -> Greeted:
        self.handled.append(req.name)
        return Greeted(text=f"hello {req.name}", request_id=current_request_id.get())

    async def forget(self, ctx: RequestContext, req: Greeting) -> None:
        self.handled.append(req.name)

    async def refuse(self, ctx: RequestContext, req: Greeting) -> None:
        raise InstanceNotFound(f"instance {req.name} could not be found")

    async def crash(self, ctx: RequestContext, req: Greeting) -> None:
        raise RuntimeError("the disk caught fire")

    async def _internal(self, ctx: RequestContext, req: Greeting) -> None:
        self.handled.append("internal")

    def not_a_coroutine(self) -> None:
        self.handled.append("sync")


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint()


@pytest.fixture
async def server(server_transport: FakeTransport, endpoint: Endpoint) -> AsyncIterator[RPCServer]:
    server = RPCServer(server_transport, TOPIC, endpoint, version="1.3")
    await server.start(prefetch=4)
    yield server
    await server.stop(drain_timeout=1)


@pytest.fixture
def client(client_transport: FakeTransport, server: RPCServer) -> RPCClient:
    return RPCClient(client_transport, TOPIC, version_cap="1.3", timeout=5)


async def _dead_letters(transport: FakeTransport, want: int = 1) -> list[bytes]:
    """Wait until ``want`` messages were dead-lettered, and take them."""
    taken: list[bytes] = []
    async with asyncio.timeout(5):
        while len(taken) < want:
            taken += await transport.dead_letters()
            if len(taken) < want:
                await asyncio.sleep(0)
    return taken


def _envelope(method: str, args: dict[str, object], deadline: float | None = None) -> bytes:
    envelope = Envelope(
        method=method, version="1.0", context=RequestContext(), args=args, deadline=deadline
    )
    return envelope.model_dump_json().encode()


def test_public_coroutines_are_the_methods(server: RPCServer) -> None:
    assert server.methods == {"greet", "forget", "refuse", "crash"}


def test_method_without_a_request_model_is_refused(server_transport: FakeTransport) -> None:
    class Untyped:
        async def poke(self, ctx: RequestContext, req: dict[str, str]) -> None: ...

    class NoRequest:
        async def poke(self, ctx: RequestContext) -> None: ...

    with pytest.raises(TypeError, match="pydantic model"):
        RPCServer(server_transport, TOPIC, Untyped(), version="1.0")
    with pytest.raises(TypeError, match=r"\(ctx, req\)"):
        RPCServer(server_transport, TOPIC, NoRequest(), version="1.0")


async def test_handler_sees_the_callers_request_id(client: RPCClient) -> None:
    ctx = RequestContext(request_id="req-trace-me")
    greeted = await client.call(ctx, "greet", Greeting(name="ada"), version="1.0", returns=Greeted)
    assert greeted == Greeted(text="hello ada", request_id="req-trace-me")
    assert current_request_id.get() is None


async def test_method_returning_nothing_is_called(client: RPCClient, endpoint: Endpoint) -> None:
    await client.call(RequestContext(), "forget", Greeting(name="x"), version="1.3")
    assert endpoint.handled == ["x"]


async def test_call_past_its_deadline_is_dropped(
    client_transport: FakeTransport, server: RPCServer, endpoint: Endpoint
) -> None:
    stale = _envelope("greet", {"name": "late"}, deadline=time.time() - 1)
    with pytest.raises(MessagingTimeout):
        await client_transport.call(TOPIC, stale, message_id="stale-1", timeout=0.2)
    assert endpoint.handled == []
    assert await client_transport.dead_letters() == []


async def test_bad_arguments_are_invalid_and_dead_lettered(
    client: RPCClient, client_transport: FakeTransport, endpoint: Endpoint
) -> None:
    class Wrong(BaseModel):
        age: int

    with pytest.raises(InvalidMessage, match="bad arguments for greet"):
        await client.call(RequestContext(), "greet", Wrong(age=3), version="1.0")
    [dead] = await _dead_letters(client_transport)
    assert Envelope.model_validate_json(dead).args == {"age": 3}
    assert endpoint.handled == []


async def test_cast_of_unknown_method_is_dead_lettered(
    client: RPCClient, client_transport: FakeTransport, endpoint: Endpoint
) -> None:
    await client.cast(RequestContext(), "greet", Greeting(name="x"), version="1.0")
    await client.cast(RequestContext(), "no_such_thing", Greeting(name="y"), version="1.0")
    [dead] = await _dead_letters(client_transport)
    assert Envelope.model_validate_json(dead).method == "no_such_thing"
    assert endpoint.handled == ["x"]


async def test_private_method_is_not_callable(client: RPCClient, endpoint: Endpoint) -> None:
    with pytest.raises(NoSuchMethod):
        await client.call(RequestContext(), "_internal", Greeting(name="x"), version="1.0")
    with pytest.raises(NoSuchMethod):
        await client.call(RequestContext(), "not_a_coroutine", Greeting(name="x"), version="1.0")
    assert endpoint.handled == []


async def test_garbage_is_dead_lettered_and_serving_goes_on(
    client: RPCClient, client_transport: FakeTransport
) -> None:
    await client_transport.cast(TOPIC, b"{not json", message_id="junk-1")
    assert await _dead_letters(client_transport) == [b"{not json"]
    greeted = await client.call(
        RequestContext(), "greet", Greeting(name="b"), version="1.0", returns=Greeted
    )
    assert greeted.text == "hello b"


async def test_rejection_answers_only_a_waiting_caller(server: RPCServer) -> None:
    with pytest.raises(RejectMessage) as silent:
        await server.handle(IncomingMessage(body=b"junk", message_id="m1"))
    assert silent.value.reply is None

    with pytest.raises(RejectMessage) as answered:
        await server.handle(IncomingMessage(body=b"junk", message_id="m2", reply_to="r.1"))
    assert answered.value.reply is not None
    reply = Reply.model_validate_json(answered.value.reply)
    assert reply.error is not None
    assert reply.error.type == "InvalidMessage"


async def test_business_error_is_sent_back_and_logged_without_traceback(
    client: RPCClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shared.rpc.server")
    with pytest.raises(InstanceNotFound, match="instance i-1 could not be found"):
        await client.call(RequestContext(), "refuse", Greeting(name="i-1"), version="1.0")
    [record] = [r for r in caplog.records if "refuse failed" in r.getMessage()]
    assert record.exc_info is None


async def test_unexpected_error_is_remote_error_and_logged_with_traceback(
    client: RPCClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="shared.rpc.server")
    with pytest.raises(RemoteError) as caught:
        await client.call(RequestContext(), "crash", Greeting(name="x"), version="1.0")
    assert caught.value.exc_type == "RuntimeError"
    assert caught.value.remote_message == "the disk caught fire"
    [record] = [r for r in caplog.records if "crash failed" in r.getMessage()]
    assert record.exc_info is not None
