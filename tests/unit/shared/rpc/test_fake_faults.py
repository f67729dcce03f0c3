"""The fake broker's faults for the model-based test: hold, reorder, duplicate, lose an
acknowledgement, kill a process between two awaits, expire calls nobody consumes."""

from __future__ import annotations

import asyncio

import pytest

from shared.exceptions import MessagingError, MessagingTimeout
from shared.rpc.fake import FakeBroker, FakeTransport
from shared.rpc.transport import IncomingMessage, Settle, Settlement


def _casts(topic: str, message: IncomingMessage) -> bool:
    return not message.is_call


class Recorder:
    """A handler that records what it saw; ``gate`` (if set) stops it half-way."""

    def __init__(self) -> None:
        self.seen: list[IncomingMessage] = []
        self.finished: list[bytes] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, message: IncomingMessage) -> Settlement:
        self.seen.append(message)
        if self.gate is not None:
            await self.gate.wait()
        self.finished.append(message.body)
        return Settlement(Settle.ACK, b"reply" if message.is_call else None)


@pytest.fixture
def held_broker() -> FakeBroker:
    return FakeBroker(hold=_casts)


async def _transport(broker: FakeBroker) -> FakeTransport:
    transport = FakeTransport(broker)
    await transport.connect()
    return transport


async def test_held_casts_wait_and_are_delivered_in_the_order_chosen(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    await server.serve("t", handler, prefetch=10)
    for body in (b"1", b"2", b"3"):
        await client.cast("t", body, message_id=body.decode())
    await asyncio.sleep(0)
    assert handler.seen == []
    assert [h.message.body for h in held_broker.held] == [b"1", b"2", b"3"]
    await held_broker.deliver(held_broker.held[2])
    await held_broker.deliver(held_broker.held[0])
    assert handler.finished == [b"3", b"1"]
    assert [h.message.body for h in held_broker.held] == [b"2"]


async def test_calls_are_not_held(held_broker: FakeBroker) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    await server.serve("t", Recorder(), prefetch=10)
    assert await client.call("t", b"q", message_id="q", timeout=5) == b"reply"
    assert held_broker.held == []


async def test_a_lost_acknowledgement_brings_the_message_back_after_its_handler_ran(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    await server.serve("t", handler, prefetch=10)
    await client.cast("t", b"x", message_id="x")
    await held_broker.deliver(held_broker.held[0], lose_ack=True)
    assert handler.finished == [b"x"]
    [again] = held_broker.held
    assert (again.message.redelivered, again.message.delivery_count) == (True, 1)
    await held_broker.deliver(again)
    assert handler.finished == [b"x", b"x"]
    assert held_broker.held == []


async def test_a_duplicate_is_a_second_copy_with_the_same_id(held_broker: FakeBroker) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    await server.serve("t", handler, prefetch=10)
    await client.cast("t", b"x", message_id="x")
    copy = held_broker.duplicate(held_broker.held[0])
    assert copy.message.message_id == "x"
    await asyncio.gather(held_broker.deliver(held_broker.held[0]), held_broker.deliver(copy))
    assert [m.message_id for m in handler.seen] == ["x", "x"]


async def test_delivering_without_a_consumer_is_refused_and_keeps_the_message(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    await server.serve("t", Recorder(), prefetch=10)
    await client.cast("t", b"x", message_id="x")
    server.kill()
    with pytest.raises(LookupError):
        held_broker.deliver(held_broker.held[0])
    assert len(held_broker.held) == 1


async def test_kill_cancels_handlers_mid_flight_and_returns_their_messages(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    handler.gate = asyncio.Event()
    await server.serve("t", handler, prefetch=10)
    await client.cast("t", b"x", message_id="x")
    task = held_broker.deliver(held_broker.held[0])
    await asyncio.sleep(0)
    assert len(handler.seen) == 1
    cancelled = server.kill()
    assert cancelled == {task}
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert handler.finished == []
    [back] = held_broker.held
    assert back.message.redelivered
    # A process serving the topic again (the restarted one) takes it.
    restarted = await _transport(held_broker)
    handler.gate = None
    await restarted.serve("t", handler, prefetch=10)
    await held_broker.deliver(back)
    assert handler.finished == [b"x"]


async def test_kill_fails_the_calls_the_process_was_waiting_for() -> None:
    broker = FakeBroker(hold=_casts)
    server, client = await _transport(broker), await _transport(broker)
    handler = Recorder()
    handler.gate = asyncio.Event()
    await server.serve("t", handler, prefetch=10)
    waiting = asyncio.create_task(client.call("t", b"q", message_id="q", timeout=30))
    await asyncio.sleep(0)
    assert client.waiting_calls() == 1
    client.kill()
    with pytest.raises(MessagingError):
        await waiting
    with pytest.raises(MessagingError):
        await client.cast("t", b"late", message_id="late")


async def test_calls_nobody_consumes_expire_at_once(held_broker: FakeBroker) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    await server.serve("t", Recorder(), prefetch=10)
    server.kill()
    waiting = asyncio.create_task(client.call("t", b"q", message_id="q", timeout=60))
    await asyncio.sleep(0)
    assert held_broker.expire_calls() == 1
    with pytest.raises(MessagingTimeout):
        await waiting
    [dead] = held_broker.dead_calls
    assert (dead.reason, dead.message_id) == ("expired", "q")
    assert held_broker.expire_calls() == 0


async def test_before_publish_runs_before_each_send(held_broker: FakeBroker) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    await server.serve("t", Recorder(), prefetch=10)
    seen: list[tuple[str, int]] = []

    async def checkpoint(topic: str) -> None:
        seen.append((topic, len(held_broker.held)))

    client.before_publish = checkpoint
    await client.cast("t", b"x", message_id="x")
    await client.call("t", b"q", message_id="q", timeout=5)
    assert seen == [("t", 0), ("t", 1)]


async def test_a_cast_fails_once_before_or_after_the_broker_took_it(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    await server.serve("t", Recorder(), prefetch=10)
    client.fail_next_cast(delivered=False)
    client.fail_next_cast(delivered=True)
    assert client.pending_cast_faults() == [False, True]
    with pytest.raises(MessagingError, match="nothing was sent"):
        await client.cast("t", b"lost", message_id="lost")
    with pytest.raises(MessagingError, match="it was sent"):
        await client.cast("t", b"sent", message_id="sent")
    await client.cast("t", b"fine", message_id="fine")
    assert [h.message.body for h in held_broker.held] == [b"sent", b"fine"]


async def test_a_disturbed_call_is_lost_before_or_after_its_callee_acted(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    await server.serve("t", handler, prefetch=10)

    client.disturb_next_call("unsent")
    with pytest.raises(MessagingTimeout, match="never arrived"):
        await client.call("t", b"unsent", message_id="u", timeout=5)
    client.disturb_next_call("reply_lost")
    with pytest.raises(MessagingTimeout, match="lost on its way back"):
        await client.call("t", b"acted", message_id="a", timeout=5)
    client.disturb_next_call("early")
    with pytest.raises(MessagingTimeout, match="in time"):
        await client.call("t", b"later", message_id="l", timeout=5)
    await asyncio.sleep(0.01)

    assert handler.finished == [b"acted", b"later"]
    assert await client.call("t", b"fine", message_id="f", timeout=5) == b"reply"


async def test_a_disturbed_call_may_arrive_twice_or_wait_to_be_delivered(
    held_broker: FakeBroker,
) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    await server.serve("t", handler, prefetch=10)

    client.disturb_next_call("twice")
    assert await client.call("t", b"twice", message_id="t", timeout=5) == b"reply"
    await asyncio.sleep(0.01)
    assert handler.finished == [b"twice", b"twice"]

    client.disturb_next_call("held")
    waiting = asyncio.create_task(client.call("t", b"held", message_id="h", timeout=5))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    [held] = held_broker.held
    await held_broker.deliver(held)
    assert await waiting == b"reply"


async def test_disarmed_faults_do_not_happen(held_broker: FakeBroker) -> None:
    server, client = await _transport(held_broker), await _transport(held_broker)
    handler = Recorder()
    await server.serve("t", handler, prefetch=10)
    client.fail_next_cast(delivered=False)
    client.disturb_next_call("unsent")
    client.disarm_faults()

    assert client.pending_cast_faults() == []
    await client.cast("t", b"cast", message_id="c")
    await held_broker.deliver(held_broker.held[0])
    assert await client.call("t", b"call", message_id="q", timeout=5) == b"reply"
    assert handler.finished == [b"cast", b"call"]
