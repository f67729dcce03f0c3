"""The settlement policy on the fake transport: retried, requeued, dead-lettered, done.

Every assertion waits for a definite event (a handler run, a dead letter, a reply);
nothing sleeps and then checks that nothing happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from pydantic import BaseModel

from shared.context import RequestContext
from shared.exceptions import (
    InstanceNotFound,
    MessagingError,
    MessagingTimeout,
    NoSuchMethod,
    NoValidHost,
    ReplyQueueLost,
    TransientError,
    Unroutable,
)
from shared.rpc.client import RPCClient
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.rpc.server import RPCServer
from shared.rpc.settlement import Outcome, RetryPolicy, classify

TOPIC = "settle"
LIMIT = 3
#: Transient failures are retried within a delivery for this long (kept short here).
FAST = RetryPolicy(handler_retry_timeout=0.05, delivery_limit=LIMIT, max_backoff=0.005)


class Job(BaseModel):
    name: str


class Endpoint:
    """Fails as told: ``failures[name]`` are raised one per run, then it succeeds;
    ``always[name]`` is raised on every run."""

    def __init__(self) -> None:
        self.failures: dict[str, list[Exception]] = {}
        self.always: dict[str, Exception] = {}
        self.runs: list[str] = []
        self.completed: list[str] = []
        self.changed = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def work(self, ctx: RequestContext, req: Job) -> None:
        self.runs.append(req.name)
        self.changed.set()
        if self.gate is not None:
            await self.gate.wait()
        if req.name in self.always:
            raise self.always[req.name]
        pending = self.failures.get(req.name, [])
        if pending:
            raise pending.pop(0)
        self.completed.append(req.name)
        self.changed.set()


async def until(endpoint: Endpoint, predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds, re-checking whenever the endpoint ran."""
    async with asyncio.timeout(5):
        while not predicate():
            endpoint.changed.clear()
            await endpoint.changed.wait()


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker(delivery_limit=LIMIT)


@pytest.fixture
async def transports(broker: FakeBroker) -> AsyncIterator[tuple[FakeTransport, FakeTransport]]:
    pair = (FakeTransport(broker), FakeTransport(broker))
    for transport in pair:
        await transport.connect()
    yield pair
    for transport in pair:
        await transport.close()


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint()


@pytest.fixture
async def client(transports: tuple[FakeTransport, FakeTransport], endpoint: Endpoint) -> RPCClient:
    server = RPCServer(transports[0], TOPIC, endpoint, version="1.0", policy=FAST)
    await server.start(prefetch=4)
    return RPCClient(transports[1], TOPIC, version_cap="1.0", timeout=5)


async def _dead(broker: FakeBroker, want: int = 1) -> None:
    async with asyncio.timeout(5):
        while True:
            if len(broker.dead_casts) >= want:
                return
            await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (NoValidHost("full"), Outcome.DONE),
        (InstanceNotFound("gone"), Outcome.DONE),
        (NoSuchMethod("no such method"), Outcome.DONE),
        (TransientError("try later"), Outcome.TRANSIENT),
        (MessagingTimeout("no reply"), Outcome.TRANSIENT),
        (Unroutable("no queue"), Outcome.TRANSIENT),
        (MessagingError("connection lost"), Outcome.TRANSIENT),
        (ReplyQueueLost("reply queue gone with its node"), Outcome.TRANSIENT),
        (asyncpg.ConnectionDoesNotExistError("connection was closed"), Outcome.TRANSIENT),
        (asyncpg.SerializationError("could not serialize"), Outcome.TRANSIENT),
        (asyncpg.DeadlockDetectedError("deadlock detected"), Outcome.TRANSIENT),
        (ConnectionRefusedError("refused"), Outcome.TRANSIENT),
        (asyncpg.UniqueViolationError("duplicate key"), Outcome.POISON),
        (ValueError("bug"), Outcome.POISON),
    ],
)
def test_classes_of_failure(error: Exception, outcome: Outcome) -> None:
    assert classify(error) is outcome


async def test_transient_failures_are_retried_then_the_work_completes_once(
    client: RPCClient, endpoint: Endpoint, broker: FakeBroker
) -> None:
    endpoint.failures["a"] = [OSError("db down"), OSError("db down")]
    await client.cast(RequestContext(), "work", Job(name="a"), version="1.0")

    await until(endpoint, lambda: endpoint.completed == ["a"])

    assert endpoint.runs == ["a", "a", "a"]
    assert broker.dead_casts == []


async def test_cast_that_keeps_failing_is_requeued_then_dead_lettered_with_its_reason(
    client: RPCClient, endpoint: Endpoint, broker: FakeBroker
) -> None:
    endpoint.always["b"] = asyncpg.CannotConnectNowError("the database is starting up")
    await client.cast(RequestContext(), "work", Job(name="b"), version="1.0")

    await _dead(broker)

    [dead] = broker.dead_casts
    assert dead.delivery_count == LIMIT + 1
    assert dead.topic == TOPIC
    assert dead.kind == "cast"
    assert "CannotConnectNowError: the database is starting up" in dead.detail
    assert f"after {LIMIT + 1} deliveries" in dead.detail
    # The service still serves what comes next.
    await client.cast(RequestContext(), "work", Job(name="next"), version="1.0")
    await until(endpoint, lambda: "next" in endpoint.completed)


async def test_business_error_of_a_cast_is_final(
    client: RPCClient, endpoint: Endpoint, broker: FakeBroker
) -> None:
    endpoint.failures["c"] = [NoValidHost("every host is full")]
    await client.cast(RequestContext(), "work", Job(name="c"), version="1.0")
    await client.cast(RequestContext(), "work", Job(name="after"), version="1.0")

    await until(endpoint, lambda: "after" in endpoint.completed)

    assert endpoint.runs.count("c") == 1
    assert broker.dead_casts == []


async def test_bug_is_dead_lettered_at_once(
    client: RPCClient, endpoint: Endpoint, broker: FakeBroker
) -> None:
    endpoint.failures["d"] = [KeyError("missing")]
    await client.cast(RequestContext(), "work", Job(name="d"), version="1.0")

    await _dead(broker)

    assert endpoint.runs == ["d"]
    [dead] = broker.dead_casts
    assert (dead.reason, dead.delivery_count) == ("rejected", 1)
    assert "KeyError" in dead.detail


async def test_call_meeting_only_transient_failures_is_answered_transient(
    client: RPCClient, endpoint: Endpoint, broker: FakeBroker
) -> None:
    endpoint.always["e"] = MessagingTimeout("no reply from scheduler")

    with pytest.raises(TransientError, match="no reply from scheduler"):
        await client.call(RequestContext(), "work", Job(name="e"), version="1.0")

    assert broker.dead_calls == []


async def test_message_held_when_the_connection_drops_is_delivered_again_meanwhile(
    client: RPCClient,
    endpoint: Endpoint,
    transports: tuple[FakeTransport, FakeTransport],
    broker: FakeBroker,
) -> None:
    endpoint.gate = asyncio.Event()
    await client.cast(RequestContext(), "work", Job(name="f"), version="1.0")
    await until(endpoint, lambda: endpoint.runs == ["f"])

    transports[0].lose_connection()
    await until(endpoint, lambda: endpoint.runs == ["f", "f"])
    endpoint.gate.set()

    # Both deliveries run to the end, at the same time: the handler had better be
    # idempotent. The first one's settlement goes nowhere; nothing is dead-lettered.
    await until(endpoint, lambda: endpoint.completed == ["f", "f"])
    assert broker.dead_casts == []


async def test_delivery_limit_dead_letters_a_message_that_never_gets_settled(
    broker: FakeBroker, transports: tuple[FakeTransport, FakeTransport], endpoint: Endpoint
) -> None:
    # A handler that kills its consumer every time: the broker counts the deliveries.
    endpoint.gate = asyncio.Event()
    server = RPCServer(transports[0], TOPIC, endpoint, version="1.0", policy=FAST)
    await server.start(prefetch=1)
    client = RPCClient(transports[1], TOPIC, version_cap="1.0")
    await client.cast(RequestContext(), "work", Job(name="g"), version="1.0")
    for delivery in range(1, LIMIT + 2):

        def delivered(count: int = delivery) -> bool:
            return len(endpoint.runs) == count

        await until(endpoint, delivered)
        transports[0].lose_connection()

    await _dead(broker)
    [dead] = broker.dead_casts
    assert (dead.reason, dead.delivery_count) == ("delivery_limit", LIMIT + 1)
    endpoint.gate.set()
