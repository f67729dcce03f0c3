"""RPCClient on the fake transport: version caps, envelopes, and what comes back."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from shared.context import RequestContext
from shared.exceptions import (
    InstanceNotFound,
    InvalidMessage,
    MessagingTimeout,
    RemoteError,
    ReplyQueueLost,
    Unroutable,
    UnsupportedVersion,
)
from shared.rpc.client import RPCClient
from shared.rpc.envelope import Envelope, ErrorInfo, Reply
from shared.rpc.fake import FakeTransport
from shared.rpc.transport import (
    Consumer,
    DeadLetter,
    Handler,
    IncomingMessage,
    Settle,
    Settlement,
    Transport,
)

TOPIC = "unit"


class Ping(BaseModel):
    n: int


class Pong(BaseModel):
    n: int


class Recorder:
    """A bare transport handler that records each envelope and answers ``reply``."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.seen: list[Envelope] = []
        self.arrived = asyncio.Event()

    async def __call__(self, message: IncomingMessage) -> Settlement:
        self.seen.append(Envelope.model_validate_json(message.body))
        self.arrived.set()
        return Settlement(Settle.ACK, self.reply)


def _error(exc_type: str, message: str) -> bytes:
    return Reply(error=ErrorInfo(type=exc_type, message=message)).model_dump_json().encode()


@pytest.mark.parametrize(
    ("cap", "version", "allowed"),
    [
        ("1.3", "1.0", True),
        ("1.3", "1.3", True),
        ("1.3", "1.4", False),
        ("1.3", "2.0", False),
        ("1.3", "0.9", False),
        ("2.0", "1.9", False),
        ("1.10", "1.9", True),
    ],
)
async def test_can_send_version(cap: str, version: str, allowed: bool) -> None:
    client = RPCClient(FakeTransport(), TOPIC, version_cap=cap)
    assert await client.can_send_version(version) is allowed


async def test_a_cap_source_is_asked_at_every_send(client_transport: FakeTransport) -> None:
    caps = ["1.0", "1.1"]

    async def current() -> str:
        return caps[0]

    client = RPCClient(client_transport, TOPIC, version_cap=current)
    assert not await client.can_send_version("1.1")
    with pytest.raises(UnsupportedVersion, match=r"the version cap for unit is 1\.0"):
        await client.cast(RequestContext(), "ping", Ping(n=1), version="1.1")
    caps.pop(0)
    assert await client.can_send_version("1.1")


def test_malformed_cap_is_refused() -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        RPCClient(FakeTransport(), TOPIC, version_cap="1")


def test_for_topic_keeps_cap_and_timeout() -> None:
    client = RPCClient(FakeTransport(), "compute", version_cap="1.2", timeout=7)
    agent = client.for_topic("compute.abc")
    assert (agent.topic, agent.version_cap, agent.timeout) == ("compute.abc", "1.2", 7)
    assert agent.transport is client.transport


async def test_refuses_to_send_above_its_cap(client_transport: FakeTransport) -> None:
    # Nobody serves the topic: had anything been published, it would be Unroutable.
    client = RPCClient(client_transport, TOPIC, version_cap="1.3")
    with pytest.raises(UnsupportedVersion, match=r"version cap for unit is 1\.3"):
        await client.call(RequestContext(), "ping", Ping(n=1), version="1.4")
    with pytest.raises(UnsupportedVersion):
        await client.cast(RequestContext(), "ping", Ping(n=1), version="2.0")
    with pytest.raises(Unroutable):
        await client.cast(RequestContext(), "ping", Ping(n=1), version="1.3")


async def test_envelope_carries_method_version_context_and_timeout(
    client_transport: FakeTransport, server_transport: FakeTransport
) -> None:
    recorder = Recorder(Reply(result={"n": 2}).model_dump_json().encode())
    await server_transport.serve(TOPIC, recorder, prefetch=1)
    client = RPCClient(client_transport, TOPIC, version_cap="1.3", timeout=30)
    ctx = RequestContext(user_id="u", project_id="p", roles=("member",))

    pong = await client.call(ctx, "ping", Ping(n=1), version="1.1", returns=Pong)
    recorder.arrived.clear()
    await client.cast(ctx, "ping", Ping(n=3), version="1.2")
    async with asyncio.timeout(5):
        await recorder.arrived.wait()

    assert pong == Pong(n=2)
    call, cast = recorder.seen
    assert (call.method, call.version, call.context, call.args) == ("ping", "1.1", ctx, {"n": 1})
    # A duration, never a wall-clock time another host would compare with its own clock.
    assert call.timeout == 30
    assert (cast.version, cast.args, cast.timeout) == ("1.2", {"n": 3}, None)


async def test_no_reply_within_the_default_timeout(
    client_transport: FakeTransport, server_transport: FakeTransport
) -> None:
    await server_transport.serve(TOPIC, Recorder(None), prefetch=1)
    client = RPCClient(client_transport, TOPIC, version_cap="1.0", timeout=0.1)
    with pytest.raises(MessagingTimeout):
        await client.call(RequestContext(), "ping", Ping(n=1), version="1.0")


@pytest.mark.parametrize(
    "reply",
    [b"not json at all", b'{"result": 1, "surprise": true}', b'{"result": {"n": "many"}}'],
)
async def test_reply_that_does_not_validate_is_invalid(
    client_transport: FakeTransport, server_transport: FakeTransport, reply: bytes
) -> None:
    await server_transport.serve(TOPIC, Recorder(reply), prefetch=1)
    client = RPCClient(client_transport, TOPIC, version_cap="1.0")
    with pytest.raises(InvalidMessage, match="from unit"):
        await client.call(RequestContext(), "ping", Ping(n=1), version="1.0", returns=Pong)


async def test_allowed_error_is_rebuilt_as_its_own_class(
    client_transport: FakeTransport, server_transport: FakeTransport
) -> None:
    reply = _error("InstanceNotFound", "Instance 42 could not be found.")
    await server_transport.serve(TOPIC, Recorder(reply), prefetch=1)
    client = RPCClient(client_transport, TOPIC, version_cap="1.0")
    with pytest.raises(InstanceNotFound) as caught:
        await client.call(RequestContext(), "ping", Ping(n=1), version="1.0")
    assert caught.value.message == "Instance 42 could not be found."


@pytest.mark.parametrize(
    "exc_type", ["SystemExit", "KeyboardInterrupt", "ConfigError", "KeelError", "os.system"]
)
async def test_error_outside_the_allow_list_is_remote_error(
    client_transport: FakeTransport, server_transport: FakeTransport, exc_type: str
) -> None:
    await server_transport.serve(TOPIC, Recorder(_error(exc_type, "oops")), prefetch=1)
    client = RPCClient(client_transport, TOPIC, version_cap="1.0")
    with pytest.raises(RemoteError) as caught:
        await client.call(RequestContext(), "ping", Ping(n=1), version="1.0")
    assert type(caught.value) is RemoteError
    assert (caught.value.exc_type, caught.value.remote_message) == (exc_type, "oops")


class LosingReplies(Transport):
    """A real transport whose first ``losses`` calls lose their reply queue after the
    request was delivered (the caller's broker node died before the answer came)."""

    def __init__(self, inner: Transport, losses: int) -> None:
        self.inner = inner
        self.losses = losses

    async def connect(self) -> None:
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes:
        reply = await self.inner.call(topic, body, message_id=message_id, timeout=timeout)
        if self.losses:
            self.losses -= 1
            raise ReplyQueueLost("connection to RabbitMQ node n1 lost; the reply queue went too")
        return reply

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None:
        await self.inner.cast(topic, body, message_id=message_id)

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer:
        return await self.inner.serve(topic, handler, prefetch=prefetch)

    async def dead_letters(self, limit: int = 100, *, calls: bool = False) -> list[DeadLetter]:
        return await self.inner.dead_letters(limit, calls=calls)

    async def purge_dead_letters(self, *, calls: bool = False) -> int:
        return await self.inner.purge_dead_letters(calls=calls)


async def test_idempotent_call_is_sent_again_when_its_reply_queue_is_lost(
    server_transport: FakeTransport, client_transport: FakeTransport
) -> None:
    recorder = Recorder(Reply(result={"n": 7}).model_dump_json().encode())
    await server_transport.serve(TOPIC, recorder, prefetch=1)
    client = RPCClient(LosingReplies(client_transport, losses=2), TOPIC, version_cap="1.0")

    pong = await client.call(
        RequestContext(), "ping", Ping(n=7), version="1.0", returns=Pong, idempotent=True
    )

    assert pong == Pong(n=7)
    assert [envelope.method for envelope in recorder.seen] == ["ping"] * 3


async def test_other_call_fails_with_the_typed_error_when_its_reply_queue_is_lost(
    server_transport: FakeTransport, client_transport: FakeTransport
) -> None:
    recorder = Recorder(Reply(result={"n": 7}).model_dump_json().encode())
    await server_transport.serve(TOPIC, recorder, prefetch=1)
    client = RPCClient(LosingReplies(client_transport, losses=1), TOPIC, version_cap="1.0")

    with pytest.raises(ReplyQueueLost, match="reply queue"):
        await client.call(RequestContext(), "ping", Ping(n=7), version="1.0", returns=Pong)

    assert len(recorder.seen) == 1
