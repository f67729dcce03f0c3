"""Processes, activities and checkpoints: how the model runs keel in one event loop.

Every keel process of the model (keel-api, the conductor, the scheduler, each agent) is
a :class:`Process`: a fake transport on the shared broker and a :class:`ModelPool` on
the shared database, both of which pass the process's *checkpoint* before every publish
and before every database step outside a transaction.

Work the model starts — delivering a held message, an API request, a sweep, a guest
report — is an :class:`Activity`: a task tagged (by a context variable, which the
tasks it starts inherit) with its process and a plan. At its checkpoints the plan may

* pause it (at the n-th checkpoint, or at every one: that is how two deliveries are
  interleaved step by step, in an order Hypothesis chooses), or
* kill its process there: every handler of that process is cancelled where it stands,
  its consumers are dropped and the messages they held go back to their queues.

Checkpoints of another process (a call's handler runs in the callee) do not count
towards an activity's plan.

:meth:`Runtime.idle` waits until nothing can move without the model: no database step
in flight, no callback ready to run, no timer due soon, and every call that waits on a
queue nobody consumes expired. A sleep due soon (a retry's backoff) takes no time: the
loop runs on a clock of its own (:class:`ModelEventLoop`), which idle() moves on to the
sleep's end, and tenacity counts its retries' time on that clock too. Everything the
model does is followed by it, so each step of the state machine ends in a state that
depends only on the steps before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import asyncpg
from anyio import to_thread

from shared.exceptions import MessagingError
from shared.rpc.fake import CallFault, FakeBroker, FakeTransport, HeldMessage
from shared.rpc.transport import Consumer, DeadLetter, Handler, Transport
from tests.model.pool import InFlight, ModelPool

LOG = logging.getLogger(__name__)
T = TypeVar("T")

#: A timer due within this many seconds is waited for by :meth:`Runtime.idle`.
SOON = 3.0
#: What idle() waits at most before it calls the system stuck.
STUCK_AFTER = 20.0
#: Log each timer idle() waits for (to find what makes the model slow).
TRACE_TIMERS = bool(os.environ.get("KEEL_MODEL_TRACE"))


class Stuck(AssertionError):
    """Something kept running (or waiting on the database) without end."""


class Broker(Protocol):
    """What the model asks of the message broker (the fake one, or RabbitMQ relayed)."""

    held: list[HeldMessage]
    dead_casts: list[DeadLetter]
    dead_calls: list[DeadLetter]

    def deliver(self, held: HeldMessage, *, lose_ack: bool = False) -> asyncio.Task[None]: ...

    def duplicate(self, held: HeldMessage) -> HeldMessage: ...

    def consumers(self, topic: str) -> list[Any]: ...

    def expire_calls(self) -> int: ...


class ModelTransport(Protocol):
    """A process's transport: a :class:`FakeTransport`, or RabbitMQ's behind a relay.

    A :class:`~shared.rpc.transport.Transport` with the model's handles on it.
    """

    before_publish: Callable[[str], Awaitable[None]] | None

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def call(self, topic: str, body: bytes, *, message_id: str, timeout: float) -> bytes: ...

    async def cast(self, topic: str, body: bytes, *, message_id: str) -> None: ...

    async def serve(self, topic: str, handler: Handler, *, prefetch: int) -> Consumer: ...

    def kill(self) -> Any: ...

    def serves(self, topic: str) -> bool: ...

    def fail_next_cast(self, *, delivered: bool) -> None: ...

    def pending_cast_faults(self) -> list[bool]: ...

    def disturb_next_call(self, fault: CallFault) -> None: ...

    def disarm_faults(self) -> None: ...


@dataclass(eq=False)
class Activity:
    id: int
    process: Process
    what: str
    task: asyncio.Task[Any] | None = None
    #: Kill the process at this checkpoint of the activity (1-based).
    kill_at: int | None = None
    #: Pause at this checkpoint; with ``step`` at every one.
    pause_at: int | None = None
    step: bool = False
    checkpoints: int = 0
    paused: asyncio.Future[None] | None = None
    #: What the activity was about to do when it paused.
    where: str = ""
    result: Any = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()


_current: contextvars.ContextVar[Activity | None] = contextvars.ContextVar(
    "model_activity", default=None
)


class Process:
    """One keel process: its transport and its pool, alive or killed."""

    def __init__(self, runtime: Runtime, name: str) -> None:
        self.runtime = runtime
        self.name = name
        self.alive = False
        self.transport: ModelTransport | None = None
        self.pool = ModelPool(runtime.db, self.checkpoint, runtime.inflight)
        #: Tasks the process runs besides its handlers (its main loop, its activities).
        self.tasks: set[asyncio.Task[Any]] = set()
        #: Cleanup to run after a kill (stop an agent's timers, end a main loop).
        self.on_kill: Callable[[], Coroutine[Any, Any, None]] | None = None
        self.kills = 0
        #: Cut off from the broker: whatever it publishes fails (messages to it are held
        #: by the machine until the cut heals).
        self.cut = False

    @property
    def db(self) -> asyncpg.Pool:
        """The pool as keel code takes it."""
        return cast(asyncpg.Pool, self.pool)

    @property
    def rpc(self) -> Transport:
        """The transport as keel code takes it."""
        assert self.transport is not None
        return cast(Transport, self.transport)

    async def connect(self, *, now: bool = True) -> ModelTransport:
        """A new transport for this (re)started process; connected unless ``now`` is False
        (an agent connects its transport itself)."""
        transport = self.runtime.new_transport()
        if now:
            await transport.connect()
        transport.before_publish = self._before_publish
        self.transport = transport
        self.alive = True
        return transport

    async def _before_publish(self, topic: str) -> None:
        await self.checkpoint(f"publish to {topic}")
        if self.cut:
            raise MessagingError(f"{self.name} is cut off from the broker")

    async def checkpoint(self, what: str) -> None:
        await self.runtime.checkpoint(self, what)

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}: {what}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def __repr__(self) -> str:
        return f"<{self.name} {'alive' if self.alive else 'dead'}>"


class Runtime:
    """The shared broker and database, the activities, and the waiting for quiet."""

    def __init__(self, db: asyncpg.Pool) -> None:
        self.db = db
        self.inflight = InFlight()
        self.broker: Broker = self.new_broker()
        self.activities: list[Activity] = []
        self._ids = itertools.count(1)
        self._cleanups: set[asyncio.Task[Any]] = set()

    def new_broker(self) -> Broker:
        """The in-memory broker, holding every cast for the model to deliver."""
        return FakeBroker(hold=lambda topic, message: not message.is_call)

    def new_transport(self) -> ModelTransport:
        assert isinstance(self.broker, FakeBroker)
        return FakeTransport(self.broker)

    async def in_transit(self) -> bool:
        """Whether a message is on its way (never, in memory: publishing is delivering)."""
        return False

    async def reset(self) -> None:
        self.broker = self.new_broker()
        self.activities.clear()

    # -- activities --------------------------------------------------------------------

    def start(
        self,
        process: Process,
        what: str,
        work: Callable[[], Awaitable[Any]],
        *,
        kill_at: int | None = None,
        pause_at: int | None = None,
        step: bool = False,
    ) -> Activity:
        """Run ``work`` as an activity of ``process`` (``work`` may create tasks itself)."""
        activity = Activity(
            next(self._ids), process, what, kill_at=kill_at, pause_at=pause_at, step=step
        )
        token = _current.set(activity)
        try:
            activity.task = process.spawn(self._run(activity, work), what)
        finally:
            _current.reset(token)
        self.activities.append(activity)
        return activity

    def adopt(
        self, process: Process, what: str, start: Callable[[], asyncio.Task[Any]], **plan: Any
    ) -> Activity:
        """Make the task ``start()`` creates (a delivery's handler) an activity."""
        activity = Activity(next(self._ids), process, what, **plan)
        token = _current.set(activity)
        try:
            task = start()
        finally:
            _current.reset(token)
        activity.task = task
        task.add_done_callback(lambda t: self._finished(activity, t))
        self.activities.append(activity)
        return activity

    async def _run(self, activity: Activity, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            activity.result = await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            activity.error = exc
        return activity.result

    def _finished(self, activity: Activity, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            activity.error = task.exception()

    def paused(self) -> list[Activity]:
        return [a for a in self.activities if a.paused is not None and not a.paused.done()]

    def resume(self, activity: Activity, *, step: bool | None = None) -> None:
        if step is not None:
            activity.step = step
        if activity.paused is not None and not activity.paused.done():
            activity.paused.set_result(None)

    def forget_finished(self) -> None:
        self.activities = [a for a in self.activities if not a.done]

    async def checkpoint(self, process: Process, what: str) -> None:
        activity = _current.get()
        if activity is None or activity.process is not process:
            return
        activity.checkpoints += 1
        n = activity.checkpoints
        if activity.kill_at == n:
            LOG.info(
                "model: killing %s at checkpoint %d of %s (%s)",
                process.name,
                n,
                activity.what,
                what,
            )
            self.kill(process)
            raise asyncio.CancelledError
        if activity.step or activity.pause_at == n:
            activity.paused = asyncio.get_running_loop().create_future()
            activity.where = what
            await activity.paused

    # -- processes ---------------------------------------------------------------------

    def kill(self, process: Process) -> None:
        """The process dies now (callable from inside one of its own handlers)."""
        if not process.alive:
            return
        process.alive = False
        process.kills += 1
        current = asyncio.current_task()
        if process.transport is not None:
            process.transport.kill()
        for task in list(process.tasks):
            if task is not current:
                task.cancel()
        if process.on_kill is not None:
            cleanup: asyncio.Task[None] = asyncio.get_running_loop().create_task(process.on_kill())
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)

    # -- waiting for quiet -------------------------------------------------------------

    async def idle(self) -> None:
        """Until nothing moves without the model (see the module docstring)."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        quiet = 0
        while True:
            await asyncio.sleep(0)
            if time.monotonic() - started > STUCK_AFTER:
                raise Stuck(f"still busy after {STUCK_AFTER}s: {self.describe_busy()}")
            if self.inflight.count:
                quiet = 0
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STUCK_AFTER):
                        await self.inflight.none.wait()
                continue
            if _ready(loop):
                quiet = 0
                continue
            if _threads_busy():
                # keel-api's synchronous dependencies run in anyio's worker threads; an
                # agent's files are written in asyncio's (Loop counts those).
                quiet = 0
                await asyncio.sleep(0.0005)
                continue
            due = _next_timer(loop)
            if due is not None and due - loop.time() < SOON:
                if TRACE_TIMERS and due - loop.time() > 0.05:
                    print(f"model: skipping {due - loop.time():.2f}s to {_timer_at(loop, due)}")
                await _until(loop, due)
                quiet = 0
                continue
            if self.broker.expire_calls():
                quiet = 0
                continue
            if self._cleanups:
                quiet = 0
                await asyncio.wait(set(self._cleanups))
                continue
            if await self.in_transit():
                quiet = 0
                await asyncio.sleep(0.002)
                continue
            quiet += 1
            if quiet >= 3:
                return

    def describe_busy(self) -> str:
        running = [a.what for a in self.activities if not a.done and a.paused is None]
        return f"{self.inflight.count} database step(s) in flight; running: {running}"


def _threads_busy() -> bool:
    if to_thread.current_default_thread_limiter().borrowed_tokens > 0:
        return True
    executor = getattr(asyncio.get_running_loop(), "_model_executor", None)
    return executor is not None and executor.busy > 0


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (``asyncio.to_thread``), counting the work it runs."""

    def __init__(self) -> None:
        super().__init__(max_workers=4, thread_name_prefix="model")
        self.busy = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self.busy += 1

        def run() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.busy -= 1

        return super().submit(run)


class ModelEventLoop(asyncio.SelectorEventLoop):
    """asyncio's event loop on a clock the model may move on (:meth:`skip`): the time a
    sleep would have waited passes at once, and timers due by then run next."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0.0

    def time(self) -> float:
        return super().time() + self.skipped

    def skip(self, seconds: float) -> None:
        self.skipped += max(seconds, 0.0)


class LoopClock:
    """The ``time`` module as tenacity sees it in the model: ``monotonic`` is the model
    loop's clock, so a retry window counts the backoffs it skipped, not the real time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def monotonic(self) -> float:
        return self._loop.time()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


async def _until(loop: asyncio.AbstractEventLoop, due: float) -> None:
    """Let the loop's clock reach ``due`` (at once on the model's loop)."""
    if isinstance(loop, ModelEventLoop):
        loop.skip(due - loop.time() + 1e-6)
        await asyncio.sleep(0)
    else:
        await asyncio.sleep(max(due - loop.time(), 0) + 0.001)


def _ready(loop: asyncio.AbstractEventLoop) -> int:
    ready = getattr(loop, "_ready", None)
    return len(ready) if ready is not None else 0


def _next_timer(loop: asyncio.AbstractEventLoop) -> float | None:
    """When the next ``asyncio.sleep`` ends (a retry's backoff, say); None if none sleeps.

    Other timers (a call's timeout, asyncpg's statement cache, a service's heartbeat
    interval) are not waited for: they belong to the processes' own clocks, which the
    model stands still.
    """
    scheduled = getattr(loop, "_scheduled", None) or []
    due = [
        t.when()
        for t in scheduled
        if not t.cancelled() and getattr(t, "_callback", None) is _SLEEP_ENDS
    ]
    return min(due) if due else None


_SLEEP_ENDS = getattr(asyncio.futures, "_set_result_unless_cancelled", None)


def _timer_at(loop: asyncio.AbstractEventLoop, due: float) -> object:
    scheduled = getattr(loop, "_scheduled", None) or []
    return next((t for t in scheduled if t.when() == due), None)


def current_activity() -> Activity | None:
    return _current.get()


@dataclass
class Outcome:
    """What an API request answered (``status`` None while it is paused or was cut)."""

    what: str
    status: int | None = None
    body: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class Loop:
    """An event loop the model runs its coroutines on, one at a time."""

    def __init__(self) -> None:
        self.loop = ModelEventLoop()
        executor = CountingExecutor()
        self.loop.set_default_executor(executor)
        self.loop._model_executor = executor  # type: ignore[attr-defined]

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
