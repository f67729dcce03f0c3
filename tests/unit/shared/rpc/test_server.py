"""RPCServer dispatch on the fake transport: routing, validation, errors, caller timeouts.

How each outcome is settled (retried, requeued, dead-lettered) is covered in
``test_settlement.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel

from shared.context import RequestContext, current_request_id, current_sender
from shared.exceptions import (
    CallerRefused,
    InstanceNotFound,
    InvalidMessage,
    NoSuchMethod,
    RemoteError,
)
from shared.rpc.agent_users import refuse_agents, user_for
from shared.rpc.client import RPCClient
from shared.rpc.envelope import Envelope, Reply
from shared.rpc.fake import FakeTransport
from shared.rpc.server import MAX_MESSAGE_BYTES, RPCServer
from shared.rpc.transport import IncomingMessage, Settle

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


async def _dead_letters(
    transport: FakeTransport, want: int = 1, *, calls: bool = False
) -> list[bytes]:
    """Wait until ``want`` casts (or calls) were dead-lettered; their bodies."""
    async with asyncio.timeout(5):
        while True:
            found = await transport.dead_letters(calls=calls)
            if len(found) >= want:
                return [dead.body for dead in found]
            await asyncio.sleep(0)


def _envelope(method: str, args: dict[str, object], timeout: float | None = None) -> bytes:
    envelope = Envelope(
        method=method, version="1.0", context=RequestContext(), args=args, timeout=timeout
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


async def test_each_handled_message_is_counted_and_timed(
    client: RPCClient, server: RPCServer
) -> None:
    for name in ("a", "b"):
        await client.call(RequestContext(), "forget", Greeting(name=name), version="1.3")
    metrics = server.metrics
    assert metrics.value("keel_rpc_handle_seconds_count", topic=TOPIC, method="forget") == 2
    assert 0 < metrics.value("keel_rpc_handle_seconds_sum", topic=TOPIC, method="forget") < 5
    settled = metrics.value("keel_rpc_messages_total", topic=TOPIC, method="forget", settled="ack")
    assert settled == 2


async def test_method_returning_nothing_is_called(client: RPCClient, endpoint: Endpoint) -> None:
    await client.call(RequestContext(), "forget", Greeting(name="x"), version="1.3")
    assert endpoint.handled == ["x"]


async def test_call_its_caller_stopped_waiting_for_is_dropped(
    server: RPCServer, endpoint: Endpoint
) -> None:
    # The timeout is a duration counted on this host's monotonic clock from arrival.
    stale = IncomingMessage(
        body=_envelope("greet", {"name": "late"}, timeout=5.0),
        message_id="stale-1",
        reply_to="r.1",
        received_at=time.monotonic() - 6.0,
    )
    settlement = await server.handle(stale)
    assert (settlement.settle, settlement.reply) == (Settle.ACK, None)
    assert endpoint.handled == []


async def test_call_within_its_timeout_is_served_whatever_the_clocks_say(
    server: RPCServer, endpoint: Endpoint
) -> None:
    fresh = IncomingMessage(
        body=_envelope("greet", {"name": "on time"}, timeout=5.0),
        message_id="fresh-1",
        reply_to="r.1",
        received_at=time.monotonic() - 4.0,
    )
    settlement = await server.handle(fresh)
    assert settlement.settle is Settle.ACK
    assert settlement.reply is not None
    assert endpoint.handled == ["on time"]


async def test_bad_arguments_are_invalid_and_dead_lettered(
    client: RPCClient, client_transport: FakeTransport, endpoint: Endpoint
) -> None:
    class Wrong(BaseModel):
        age: int

    with pytest.raises(InvalidMessage, match="bad arguments for greet"):
        await client.call(RequestContext(), "greet", Wrong(age=3), version="1.0")
    [dead] = await _dead_letters(client_transport, calls=True)
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
    silent = await server.handle(IncomingMessage(body=b"junk", message_id="m1"))
    assert (silent.settle, silent.reply) == (Settle.DEAD_LETTER, None)

    answered = await server.handle(IncomingMessage(body=b"junk", message_id="m2", reply_to="r.1"))
    assert answered.settle is Settle.DEAD_LETTER
    assert answered.reply is not None
    reply = Reply.model_validate_json(answered.reply)
    assert reply.error is not None
    assert reply.error.type == "InvalidMessage"
    assert "malformed envelope" in answered.reason


async def test_version_is_checked_before_the_method(server: RPCServer) -> None:
    envelope = Envelope(method="no_such_thing", version="2.0", context=RequestContext())
    message = IncomingMessage(
        body=envelope.model_dump_json().encode(), message_id="m3", reply_to="r.1"
    )
    settlement = await server.handle(message)
    assert settlement.reply is not None
    reply = Reply.model_validate_json(settlement.reply)
    assert reply.error is not None
    assert reply.error.type == "UnsupportedVersion"


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


async def test_an_oversized_message_is_dead_lettered_unread(server: RPCServer) -> None:
    envelope = Envelope(method="greet", version="1.0", context=RequestContext())
    body = envelope.model_dump_json().encode()
    huge = body[:-1] + b', "padding": "' + b"x" * MAX_MESSAGE_BYTES + b'"}'
    settlement = await server.handle(IncomingMessage(body=huge, message_id="m4", reply_to="r.1"))
    assert settlement.settle is Settle.DEAD_LETTER
    assert settlement.reply is not None
    reply = Reply.model_validate_json(settlement.reply)
    assert reply.error is not None
    assert reply.error.type == "InvalidMessage"
    assert "larger than" in reply.error.message


class Sender(BaseModel):
    name: str
    sender: str | None


class Whoami:
    async def whoami(self, ctx: RequestContext, req: Greeting) -> Sender:
        return Sender(name=req.name, sender=current_sender.get())


async def only_ada(sender: str | None, method: str, request: BaseModel) -> None:
    if sender != "ada":
        raise CallerRefused(f"{method} refused for {sender}")


async def test_a_guard_sees_the_broker_user_and_refuses_before_the_method(
    server_transport: FakeTransport,
) -> None:
    server = RPCServer(server_transport, TOPIC, Whoami(), version="1.0", guard=only_ada)
    body = _envelope("whoami", {"name": "x"})
    allowed = await server.handle(
        IncomingMessage(body=body, message_id="m1", reply_to="r.1", user_id="ada")
    )
    refused = await server.handle(
        IncomingMessage(body=body, message_id="m2", reply_to="r.1", user_id="eve")
    )
    assert allowed.settle is Settle.ACK
    assert allowed.reply is not None
    assert Reply.model_validate_json(allowed.reply).result == {"name": "x", "sender": "ada"}
    # A refusal is an answer, not a failure: acknowledged, with the typed error.
    assert refused.settle is Settle.ACK
    assert refused.reply is not None
    error = Reply.model_validate_json(refused.reply).error
    assert error is not None
    assert (error.type, error.message) == ("CallerRefused", "whoami refused for eve")
    assert current_sender.get() is None


async def test_refuse_agents_lets_the_control_plane_through_and_logs_an_agent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = user_for(uuid.uuid4())
    await refuse_agents("guest", "select_destinations", Greeting(name="x"))
    await refuse_agents(None, "select_destinations", Greeting(name="x"))
    with caplog.at_level(logging.WARNING), pytest.raises(CallerRefused, match=agent):
        await refuse_agents(agent, "select_destinations", Greeting(name="x"))
    [record] = [r for r in caplog.records if getattr(r, "decision", None) == "rpc_refused"]
    assert (record.sender, record.rpc_method) == (agent, "select_destinations")  # type: ignore[attr-defined]
