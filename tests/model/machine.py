"""The state machine Hypothesis drives: operations, faults, and the invariants after each.

Each rule is one thing that can happen to a cloud — an API call, a process killed or
started, a host crashing, an operator command, time passing, a periodic job — or one
thing the broker does with a held message: deliver it (perhaps pausing its handler at
its n-th checkpoint, or killing its process there, or losing the acknowledgement so it
comes back), duplicate it, or deliver two at once, interleaved step by step in an order
Hypothesis draws. After every rule the world is run until idle and the per-step
invariants are checked; at the end of each example :meth:`KeelMachine.teardown` settles
the cloud (everything delivered and resumed, every host back, every deadline passed and
swept) and checks the invariants of quiescence (:mod:`tests.model.invariants`).

The model plays a careful operator: it evacuates only servers whose host has crashed
or is cut off (keel-api then decides whether the host fenced itself), renames a host
only while its agent is stopped, and never asks for anything the API documents as
refused — except by accident, which the API must answer with a 4xx.

Rules gated on :data:`tests.model.known.UNFIXED` stay off while the finding they would
trip over is open (its explicit example in ``test_findings.py`` is an xfail), so the
search keeps finding *new* problems on main.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from uuid import UUID

import httpx
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shared.db import service_maintenance
from shared.exceptions import KeelError
from shared.rpc.fake import HeldMessage
from tests.model import known
from tests.model.hosts import Host
from tests.model.invariants import Observer
from tests.model.runtime import Activity, Loop, Process
from tests.model.world import DOWN_TIME, IMAGE_ID, PAST_EVERY_DEADLINE, World

LOG = logging.getLogger(__name__)
T = TypeVar("T")
#: Print each broken invariant when it is found (KEEL_MODEL_TRACE=1), before shrinking.
TRACE = bool(os.environ.get("KEEL_MODEL_TRACE"))
#: Append a line per step to this file (KEEL_MODEL_TRACE_FILE): two runs must match.
TRACE_FILE = os.environ.get("KEEL_MODEL_TRACE_FILE")

index = st.integers(min_value=0, max_value=7)
hosts = st.integers(min_value=0, max_value=2)
#: What happens to the activity a rule starts: nothing, a pause or a kill at step n.
plans = st.one_of(
    st.just({}),
    st.builds(lambda n: {"pause_at": n}, st.integers(1, 6)),
    st.builds(lambda n: {"kill_at": n}, st.integers(1, 6)),
)
ADVANCES = (30.0, DOWN_TIME + 1, 121.0, 601.0, 1801.0, 3601.0)


class KeelMachine(RuleBasedStateMachine):
    #: Set by the test before Hypothesis runs the machine (one world per test).
    world: ClassVar[World]
    runner: ClassVar[Loop]
    #: How many examples ran, and their steps (for the examples-per-second figure).
    examples: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self.w = self.world
        self.rt = self.w.rt
        self.observer = Observer(self.w)
        self.run(self.w.start())
        self.servers: list[UUID] = []
        self.renames = 0
        self.steps = 0
        #: (what, status) of every API request answered, in order.
        self.answers: list[tuple[str, int]] = []
        #: Servers whose create was answered 202; the last answer to each server's delete.
        self.created: set[UUID] = set()
        self.creates_sent = 0
        self.deletes: dict[UUID, int] = {}
        type(self).examples += 1

    # -- plumbing ----------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def act(self, action: Awaitable[object] | None = None) -> None:
        """Do ``action`` (if any), then run the world until nothing moves without us."""

        # Each step starts from the same random state, whatever the last one drew (the
        # scheduler's choices, retry jitter): a replayed step does what it did.
        self.steps += 1
        self.w.seed(self.steps)

        async def go() -> None:
            if action is not None:
                await action
            await self.rt.idle()
            self.rt.forget_finished()

        self.run(go())

    def host(self, i: int) -> Host:
        return self.w.hosts[i % len(self.w.hosts)]

    def server(self, i: int) -> UUID | None:
        return self.servers[i % len(self.servers)] if self.servers else None

    def api(
        self,
        what: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        version: str | None = None,
        plan: dict[str, Any] | None = None,
    ) -> None:
        async def request() -> httpx.Response:
            assert self.w.http is not None
            headers = {"OpenStack-API-Version": f"compute {version}"} if version else {}
            response = await self.w.http.request(method, path, json=body, headers=headers)
            status = response.status_code
            self.answers.append((what, status))
            if what == "create" and status == 202:
                self.created.add(UUID(response.json()["server"]["id"]))
            if what == "delete":
                self.deletes[UUID(path.rsplit("/", 1)[1])] = status
            # 503 is an answer ("nothing will happen", checked at quiescence); 5xx else never.
            if status >= 500 and status != 503:
                self.observer.api_errors.append(
                    f"I0 {what} answered {status}: {response.text[:300]}"
                )
            return response

        async def go() -> None:
            if not self.w.api.alive:
                await self.w.start_api()
            self.rt.start(self.w.api, what, request, **(plan or {}))

        self.act(go())

    async def _host_of(self, server: UUID) -> Host | None:
        async with self.w.db.acquire() as conn:
            node = await conn.fetchval(
                "SELECT n.uuid FROM instances i JOIN compute_nodes n ON n.id = i.compute_id "
                "WHERE i.uuid = $1",
                server,
            )
        return next(
            (h for h in self.w.hosts if h.node_uuid is not None and h.node_uuid == node), None
        )

    async def _service_uuid(self, host: Host) -> UUID | None:
        async with self.w.db.acquire() as conn:
            found: UUID | None = await conn.fetchval(
                """SELECT uuid FROM services WHERE host = $1 AND "binary" = 'keel-compute'
                     AND deleted_at IS NULL""",
                host.name,
            )
        return found

    def deliverable(self) -> list[HeldMessage]:
        """Held messages a consumer could take now (none for an agent cut off)."""
        broker = self.rt.broker
        cut = {
            process
            for host, process in self.w.agents.items()
            if self.w.hosts[host].cut_for is not None
        }
        return [
            h
            for h in broker.held
            if broker.consumers(h.topic) and self.consumer_of(h.topic) not in cut
        ]

    def consumer_of(self, topic: str) -> Process | None:
        for process in [self.w.conductor, self.w.scheduler, self.w.api, *self.w.agents.values()]:
            if process.alive and process.transport is not None and process.transport.serves(topic):
                return process
        return None

    def _deliver(
        self, held: HeldMessage, *, lose_ack: bool = False, **plan: Any
    ) -> Activity | None:
        process = self.consumer_of(held.topic)
        if process is None:
            return None
        method = held.message.body[:60].decode(errors="replace")
        return self.rt.adopt(
            process,
            f"deliver {method} to {process.name}",
            lambda: self.rt.broker.deliver(held, lose_ack=lose_ack),
            **plan,
        )

    # -- the API -----------------------------------------------------------------------

    @rule(on=st.none() | hosts, plan=plans)
    def create(self, on: int | None = None, plan: dict[str, Any] | None = None) -> None:
        server: dict[str, Any] = {
            "name": "s",
            "flavorRef": "1",
            "imageRef": str(IMAGE_ID),
            "networks": "none",
        }
        if on is not None:
            server["host"] = self.host(on).name  # a requested host (2.74): still filtered
        self.creates_sent += 1
        self.api(
            "create", "POST", "/v2.1/servers", body={"server": server}, version="2.74", plan=plan
        )

    @rule(i=index, plan=plans)
    def delete(self, i: int, plan: dict[str, Any] | None = None) -> None:
        if not self.servers or self.gated_by_move(i, known.DELETE_DURING_MOVE):
            return
        self.api("delete", "DELETE", f"/v2.1/servers/{self.server(i)}", plan=plan)

    @rule(i=index, action=st.sampled_from(["os-stop", "os-start", "soft", "hard"]), plan=plans)
    def power(self, i: int, action: str, plan: dict[str, Any] | None = None) -> None:
        if not self.servers:
            return
        body: dict[str, Any] = (
            {"reboot": {"type": action.upper()}} if action in ("soft", "hard") else {action: None}
        )
        self.api(action, "POST", f"/v2.1/servers/{self.server(i)}/action", body=body, plan=plan)

    @rule(i=index, to=st.none() | hosts, plan=plans)
    def evacuate(self, i: int, to: int | None = None, plan: dict[str, Any] | None = None) -> None:
        server = self.server(i)
        if server is None:
            return
        source = self.run(self._host_of(server))
        if source is None or (source.powered and source.cut_for is None):
            # The operator evacuates a host that crashed, or one cut off: keel-api lets
            # it only once the host fenced itself.
            return
        body: dict[str, Any] = {"evacuate": {} if to is None else {"host": self.host(to).name}}
        self.api(
            "evacuate",
            "POST",
            f"/v2.1/servers/{server}/action",
            body=body,
            version="2.29",
            plan=plan,
        )

    @rule(i=index, to=st.none() | hosts, plan=plans)
    def migrate(self, i: int, to: int | None = None, plan: dict[str, Any] | None = None) -> None:
        if not self.servers:
            return
        body: dict[str, Any] = {"migrate": None if to is None else {"host": self.host(to).name}}
        self.api(
            "migrate",
            "POST",
            f"/v2.1/servers/{self.server(i)}/action",
            body=body,
            version="2.56",
            plan=plan,
        )

    @rule(i=index, confirm=st.booleans(), plan=plans)
    def finish_resize(self, i: int, confirm: bool, plan: dict[str, Any] | None = None) -> None:
        if not self.servers:
            return
        name = "confirmResize" if confirm else "revertResize"
        self.api(
            name, "POST", f"/v2.1/servers/{self.server(i)}/action", body={name: None}, plan=plan
        )

    @rule(h=hosts, down=st.booleans())
    def force_down(self, h: int, down: bool) -> None:
        service = self.run(self._service_uuid(self.host(h)))
        if service is not None:
            self.api(
                f"forced_down={down}",
                "PUT",
                f"/v2.1/os-services/{service}",
                body={"forced_down": down},
                version="2.53",
            )

    @rule(h=hosts)
    def delete_service(self, h: int) -> None:
        host = self.host(h)
        if host.powered and self.w.agent(host) is not None:
            return  # the operator deletes services of hosts that are gone
        service = self.run(self._service_uuid(host))
        if service is None:
            return
        self.api("service delete", "DELETE", f"/v2.1/os-services/{service}", version="2.53")
        self.run(self._mark_gone(host))

    async def _mark_gone(self, host: Host) -> None:
        async with self.w.db.acquire() as conn:
            left = await conn.fetchval(
                """SELECT count(*) FROM services WHERE host = $1 AND "binary" = 'keel-compute'
                     AND deleted_at IS NULL""",
                host.name,
            )
        host.gone = left == 0

    @rule(h=hosts)
    def rename(self, h: int) -> None:
        host = self.host(h)
        if self.w.agent(host) is not None or host.gone:
            return  # renamed only while its agent is stopped

        async def rename() -> None:
            new = f"host{host.index}r{self.renames + 1}"
            async with self.w.db.acquire() as conn:
                try:
                    await service_maintenance.rename_compute(conn, host.name, new, DOWN_TIME)
                except KeelError:
                    return
            self.renames += 1
            host.name = new

        self.act(rename())

    # -- processes and hosts -----------------------------------------------------------

    @rule(h=hosts, force_down=st.booleans())
    def crash(self, h: int, force_down: bool) -> None:
        host = self.host(h)
        self.act(self._crash(host))
        if force_down:
            self.force_down(h, True)

    async def _crash(self, host: Host) -> None:
        self.w.crash(host)

    @rule(h=hosts)
    def kill_agent(self, h: int) -> None:
        process = self.w.agent(self.host(h))
        if process is not None:
            self.act(self._kill(process))

    async def _kill(self, process: Process) -> None:
        self.rt.kill(process)

    @rule(h=hosts)
    def start_agent(self, h: int) -> None:
        host = self.host(h)
        if not host.gone and host.cut_for is None:
            self.act(self.w.start_agent(host))

    # -- partitions --------------------------------------------------------------------

    @rule(h=hosts)
    def cut(self, h: int) -> None:
        """The host's network is cut: nothing reaches its agent, nothing it sends leaves."""
        host = self.host(h)
        process = self.w.agent(host)
        if process is None or host.cut_for is not None:
            return
        host.cut_for = 0.0
        process.cut = True
        self.w.agent_objects[host.index].fencing.contact_lost()

    @rule(h=hosts, plan=plans)
    def heal(self, h: int, plan: dict[str, Any] | None = None) -> None:
        """The cut heals: the agent's heartbeats get through, and it reconciles (its
        watchdog's look) before it starts anything again."""
        host = self.host(h)
        if host.cut_for is None:
            return
        self.act(self._heal(host, **(plan or {})))

    async def _heal(self, host: Host, **plan: Any) -> None:
        host.cut_for = None
        process = self.w.agent(host)
        if process is None:
            return
        process.cut = False
        fencing = self.w.agent_objects[host.index].fencing
        fencing.heartbeat_succeeded(fencing.now())
        self.rt.start(process, f"reconnect of {host.name}", fencing.tick, **plan)

    @rule(which=st.sampled_from(["conductor", "scheduler", "api"]))
    def kill_control(self, which: str) -> None:
        process = getattr(self.w, which)
        if process.alive:
            self.act(self._kill(process))

    @rule(which=st.sampled_from(["conductor", "scheduler"]))
    def start_control(self, which: str) -> None:
        process = getattr(self.w, which)
        if not process.alive:
            self.act(self.w.start_conductor() if which == "conductor" else self.w.start_scheduler())

    @rule(
        which=st.sampled_from(["api", "conductor"]),
        delivered=st.booleans(),
    )
    def cast_fails(self, which: str, delivered: bool) -> None:
        """The next cast of keel-api (or the conductor) fails; perhaps after it went out."""
        process = getattr(self.w, which)
        if not process.alive or process.transport is None:
            return
        pending = process.transport.pending_cast_faults()
        # While finding 9 is open, keel-api never gives up (three failures in a row) on a
        # cast one of whose attempts went out (its example is in test_findings.py).
        ambiguous = delivered or any(pending)
        if known.AMBIGUOUS_PUBLISH in known.UNFIXED and ambiguous and len(pending) >= 2:
            return
        process.transport.fail_next_cast(delivered=delivered)

    @rule(h=hosts, operation=st.sampled_from(["spawn", "rebuild"]))
    def fail_next(self, h: int, operation: str) -> None:
        self.host(h).driver.fail_next.add(operation)

    # -- time and periodic work --------------------------------------------------------

    @rule(seconds=st.sampled_from(ADVANCES))
    def advance(self, seconds: float) -> None:
        self.act(self._advance(seconds))

    async def _advance(self, seconds: float) -> None:
        await self.w.advance(seconds)
        await self.w.control_heartbeats()
        for host in self.w.hosts:
            if host.cut_for is None:
                self.w.heartbeat(host)
                continue
            # Cut off that long, its agent has fenced itself (its own clock: the model
            # moves the database's).
            host.cut_for += seconds
            process = self.w.agent(host)
            agent = self.w.agent_objects.get(host.index)
            fence_after = 0.0 if agent is None else agent.fencing.fence_after
            if process is not None and agent is not None and host.cut_for >= fence_after > 0:
                self.rt.start(process, f"self-fence of {host.name}", agent.fencing.fence)

    @rule(h=hosts, plan=plans)
    def guest_report(self, h: int, plan: dict[str, Any] | None = None) -> None:
        self.act(self._start(lambda: self.w.reconcile(self.host(h), **(plan or {}))))

    @rule(plan=plans)
    def sweep(self, plan: dict[str, Any] | None = None) -> None:
        self.act(self._start(lambda: self.w.sweep(**(plan or {}))))

    async def _start(self, start: Any) -> None:
        start()

    # -- messages ----------------------------------------------------------------------

    @rule(k=index, plan=plans, lose_ack=st.booleans())
    def deliver(self, k: int, plan: dict[str, Any] | None = None, lose_ack: bool = False) -> None:
        ready = self.deliverable()
        if not ready:
            return
        self.act(
            self._start(
                lambda: self._deliver(ready[k % len(ready)], lose_ack=lose_ack, **(plan or {}))
            )
        )

    @rule()
    def deliver_oldest(self) -> None:
        ready = self.deliverable()
        if ready:
            self.act(self._start(lambda: self._deliver(ready[0])))

    @rule()
    def deliver_all(self) -> None:
        """Run handlers until quiescent: every held message, oldest first."""
        self.act(self.drain())

    @rule(k=index)
    def duplicate(self, k: int) -> None:
        ready = self.deliverable()
        if not ready:
            return
        self.act(self._start(lambda: self.rt.broker.duplicate(ready[k % len(ready)])))

    @rule(k=index, j=st.none() | index, order=st.lists(st.integers(0, 1), max_size=10))
    def interleave(self, k: int, j: int | None, order: list[int]) -> None:
        """Deliver message k with a duplicate of it (or with message j), step by step."""
        ready = self.deliverable()
        if not ready:
            return
        first = ready[k % len(ready)]
        second = ready[j % len(ready)] if j is not None else first
        if second is first:
            # A second copy of the same message (over RabbitMQ it arrives a little later).
            self.act(self._start(lambda: self.rt.broker.duplicate(first)))
            copies = [h for h in self.deliverable() if h.message == first.message and h != first]
            if not copies:
                return
            second = copies[-1]
        pair: list[Activity | None] = []

        async def begin() -> None:
            pair.append(self._deliver(first, step=True))
            pair.append(self._deliver(second, step=True))

        self.act(begin())
        for choice in order:
            activity = pair[choice]
            if activity is not None and activity.paused is not None and not activity.paused.done():
                self.act(self._start(lambda a=activity: self.rt.resume(a)))
        for activity in pair:
            if activity is not None:
                self.act(self._start(lambda a=activity: self.rt.resume(a, step=False)))

    @rule(k=index)
    def resume(self, k: int) -> None:
        paused = self.rt.paused()
        if not paused:
            return
        self.act(self._start(lambda: self.rt.resume(paused[k % len(paused)], step=False)))

    # -- for scripted examples ---------------------------------------------------------

    def deliver_named(self, method: str, h: int | None = None, **plan: Any) -> bool:
        """Deliver the oldest held ``method`` (to host h's agent, if given); False if none."""
        process = None if h is None else self.w.agent(self.host(h))
        if h is not None and (process is None or process.transport is None):
            return False
        marker = f'"method":"{method}"'.encode()
        for held in self.deliverable():
            mine = process is None or (
                process.transport is not None and process.transport.serves(held.topic)
            )
            if marker in held.message.body and mine:
                self.act(self._start(lambda chosen=held: self._deliver(chosen, **plan)))
                return True
        return False

    def state_of(self, i: int = 0) -> tuple[str, str | None, str | None]:
        """Server i's (vm_state, task_state, host) as the database has it now."""

        async def read() -> tuple[str, str | None, str | None]:
            async with self.w.db.acquire() as conn:
                row = await conn.fetchrow(
                    "SELECT vm_state, task_state, host FROM instances WHERE uuid = $1",
                    self.server(i),
                )
            assert row is not None, f"no server {i}"
            return (row["vm_state"], row["task_state"], row["host"])

        return self.run(read())

    def moves_of(self, i: int = 0) -> list[str]:
        """The statuses of server i's moves, oldest first."""

        async def read() -> list[str]:
            async with self.w.db.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT status FROM migrations WHERE instance_uuid = $1 ORDER BY id",
                    self.server(i),
                )
            return [r["status"] for r in rows]

        return self.run(read())

    # -- gates -------------------------------------------------------------------------

    def gated_by_move(self, i: int, finding: int) -> bool:
        """True while ``finding`` is open and server i has a move that has not ended."""
        if finding not in known.UNFIXED:
            return False
        server = self.server(i)

        async def moving() -> bool:
            async with self.w.db.acquire() as conn:
                return bool(
                    await conn.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM migrations WHERE instance_uuid = $1 AND "
                        "status IN ('accepted', 'pre-migrating', 'done', 'finished', 'confirming', "
                        "'reverting'))",
                        server,
                    )
                )

        return self.run(moving())

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def every_step(self) -> None:
        if TRACE_FILE:
            self.run(self._trace())
        problems = self.run(self.observer.after_step())
        self.servers = self.observer.servers
        if problems and TRACE:
            print("model: after a step:", *problems, sep="\n  ")
        assert not problems, "\n".join(problems)

    async def _trace(self) -> None:
        """One line of what the world looks like now (to compare two runs of the search)."""
        assert TRACE_FILE is not None
        async with self.w.db.acquire() as conn:
            rows = await conn.fetch(
                "SELECT vm_state, task_state, compute_id, deleted_at IS NULL FROM instances "
                "ORDER BY id"
            )
            moves = await conn.fetch("SELECT status FROM migrations ORDER BY id")
            nodes = await conn.fetch(
                "SELECT n.id, n.host, n.deleted_at IS NULL, s.forced_down, "
                "s.last_seen_up > now() - interval '60 seconds' FROM compute_nodes n "
                "LEFT JOIN services s ON s.id = n.service_id ORDER BY n.id"
            )
        held = [h.message.body[10:40] for h in self.rt.broker.held]
        guests = [len(h.driver.guests()) for h in self.w.hosts]
        acts = [(a.what[:30], a.checkpoints, a.where, a.done) for a in self.rt.activities]
        with Path(TRACE_FILE).open("a") as trace:  # noqa: ASYNC230 (a debugging aid)
            print(
                self.examples,
                self.steps,
                [tuple(r) for r in rows],
                [m[0] for m in moves],
                held,
                guests,
                acts,
                [tuple(n) for n in nodes],
                [p.name for p in self.w.agents.values() if p.alive],
                file=trace,
            )

    def teardown(self) -> None:
        try:
            self.run(self.settle())
            problems = self.run(self.observer.at_quiescence())
            problems += self.run(self.answered_problems())
            if problems and TRACE:
                print("model: at quiescence:", *problems, sep="\n  ")
            assert not problems, "at quiescence:\n" + "\n".join(problems)
        finally:
            self.run(self.w.stop())

    async def answered_problems(self) -> list[str]:
        """I0 at quiescence: 503 meant nothing happened, 202 that it did."""
        async with self.w.db.acquire() as conn:
            rows = await conn.fetch("SELECT uuid, deleted_at IS NOT NULL AS gone FROM instances")
        deleted = {r["uuid"] for r in rows if r["gone"]}
        live = {r["uuid"] for r in rows} - deleted
        creates = sum(1 for what, _ in self.answers if what == "create")
        cut = self.creates_sent - creates  # no answer: the client cannot tell
        problems = []
        unasked = live - self.created
        if len(unasked) > cut:
            problems.append(f"I0 servers exist that no create was answered 202 for: {unasked}")
        for server, status in self.deletes.items():
            if status == 503 and server in deleted:
                problems.append(f"I0 server {server} was deleted although its delete got 503")
            if status in (202, 204) and server not in deleted:
                problems.append(f"I0 server {server} lives although its delete got {status}")
        return problems

    async def settle(self) -> None:
        """Everything delivered and resumed, every host back, every deadline passed."""
        w, rt = self.w, self.rt
        w.seed(1000 + self.steps)
        for host in w.hosts:
            if host.cut_for is not None:
                await self._heal(host)
        for _ in range(6):
            for activity in rt.paused():
                rt.resume(activity, step=False)
            if not w.conductor.alive:
                await w.start_conductor()
            if not w.scheduler.alive:
                await w.start_scheduler()
            for host in w.hosts:
                if not host.gone:
                    await w.start_agent(host)
            await self.drain()
            for host in w.hosts:
                w.reconcile(host)
            await self.drain()
            await w.advance(PAST_EVERY_DEADLINE)
            await w.control_heartbeats()
            for host in w.hosts:
                w.heartbeat(host)
            await self.drain()
            w.sweep()
            await self.drain()
            for host in w.hosts:
                w.reconcile(host)
            await self.drain()
            if not rt.broker.held and not rt.paused():
                break

    async def drain(self, limit: int = 300) -> None:
        """Deliver held messages, oldest first, until none can be."""
        await self.rt.idle()
        for _ in range(limit):
            for activity in self.rt.paused():
                self.rt.resume(activity, step=False)
            ready = self.deliverable()
            if not ready:
                break
            self._deliver(ready[0])
            await self.rt.idle()
        self.rt.forget_finished()
