"""The plumbing of the model's state machine: running steps, the API, settling.

:class:`MachineBase` runs each step's coroutines on the world's event loop and then the
world until idle (:meth:`~MachineBase.act`), sends keel-api requests as activities of
its process (:meth:`~MachineBase.api`), delivers held messages as activities of their
consumer, and, at the end of every example, settles the cloud and checks the invariants
of quiescence (:meth:`~MachineBase.teardown`). The rules are in
:mod:`tests.model.machine`; scripted examples use the helpers here too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from uuid import UUID

import asyncpg
import httpx
from hypothesis.stateful import RuleBasedStateMachine

from services.api.servers import publish
from services.compute.rpcapi import topic_for
from shared.objects import transitions as states
from shared.rpc.fake import HeldMessage
from shared.versions import SERVICE_VERSION
from tests.model import known
from tests.model.hosts import Host
from tests.model.invariants import Observer
from tests.model.runtime import Activity, Loop, Process
from tests.model.world import PAST_EVERY_DEADLINE, World

LOG = logging.getLogger(__name__)
T = TypeVar("T")
#: Print each broken invariant when it is found (KEEL_MODEL_TRACE=1), before shrinking.
TRACE = bool(os.environ.get("KEEL_MODEL_TRACE"))
#: Append a line per step to this file (KEEL_MODEL_TRACE_FILE): two runs must match.
TRACE_FILE = os.environ.get("KEEL_MODEL_TRACE_FILE")
#: Rounds of delivering, healing and passing deadlines the cloud gets to drain.
SETTLE_ROUNDS = 6


class MachineBase(RuleBasedStateMachine):
    #: Set by the test before Hypothesis runs the machine (one world per test).
    world: ClassVar[World]
    runner: ClassVar[Loop]
    #: How many examples ran, and their steps (for the examples-per-second figure).
    examples: ClassVar[int] = 0
    #: The example that first broke an invariant (before any shrinking), if one did.
    first_failure: ClassVar[int | None] = None
    #: Start the cloud in the first rule (an ``@initialize`` rule that calls
    #: :meth:`begin`) rather than at once: the search's examples draw the agents' release
    #: first, so none starts a cloud only to start it over as another release.
    begins_in_initialize: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.w = self.world
        self.rt = self.w.rt
        self.observer = Observer(self.w)
        #: Coroutines run on the world's loop so far, and as of the last check of the
        #: invariants (a step that ran none changed nothing they read).
        self.runs = 0
        self.checked_at_run = 0
        self.started = False
        if not self.begins_in_initialize:
            self.begin()
        self.servers: list[UUID] = []
        self.renames = 0
        self.steps = 0
        #: (what, status) of every API request answered, in order.
        self.answers: list[tuple[str, int]] = []
        #: Servers whose create was answered 202.
        self.created: set[UUID] = set()
        self.creates_sent = 0
        #: What the deletes of each server were answered: 202/204 once one was accepted,
        #: else the last answer.
        self.deletes: dict[UUID, int] = {}
        #: Deletes (and force-deletes) sent per server, and of those how many answered: a
        #: delete cut off before its answer may have happened, whatever a later one says.
        self.deletes_sent: dict[UUID, int] = {}
        self.deletes_answered: dict[UUID, int] = {}
        #: The last restore of each soft-deleted server answered (202 or 503) with no
        #: delete sent after it: 202 says the server comes back, 503 that it stays
        #: soft-deleted (unless a restore of it was cut off before its answer).
        self.restores: dict[UUID, int] = {}
        #: Restores of each soft-deleted server sent and not (yet) answered.
        self.restores_unanswered: dict[UUID, int] = {}
        #: (what, request id, status) of every API request answered: what keel recorded
        #: under its id is checked against its answer (I0).
        self.answered_ids: list[tuple[str, str, int]] = []
        type(self).examples += 1

    # -- plumbing ----------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        self.runs += 1
        return self.runner.run(coro)

    def begin(self, agent_release: int = SERVICE_VERSION) -> None:
        """Start the example's cloud, every agent running ``agent_release``."""
        self.started = True
        self.run(self.w.start(agent_release=agent_release))

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

    def failed(self, problems: list[str]) -> None:
        """Remember the first example that broke an invariant (the search's cost)."""
        if problems and type(self).first_failure is None:
            type(self).first_failure = self.examples

    def restart_as(self, agent_release: int) -> None:
        """Start the example over with every agent running ``agent_release``."""
        if not self.started:
            self.begin(agent_release)
            return

        async def restart() -> None:
            await self.w.stop()
            await self.w.start(agent_release=agent_release)
            await self.rt.idle()

        self.run(restart())

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
        target = UUID(path.split("/")[3]) if what in ("delete", "forceDelete") else None
        # A delete of a server already gone (its create withdrawn, or deleted before)
        # promises nothing, whatever it answers (404, or 503 in an outage).
        gone_before = target is not None and self.run(self._gone(target))
        if target is not None:
            self.deletes_sent[target] = self.deletes_sent.get(target, 0) + 1
            self.restores.pop(target, None)  # the delete decides now
        restore_of = UUID(path.split("/")[3]) if what == "restore" else None
        # A restore of a server that is not soft-deleted promises nothing, whatever it
        # answers (409, or 503 in an outage).
        judged = restore_of if restore_of and self.run(self._soft_deleted(restore_of)) else None
        if judged is not None:
            self.restores.pop(judged, None)  # unknown until it is answered
            self.restores_unanswered[judged] = self.restores_unanswered.get(judged, 0) + 1

        async def request() -> httpx.Response:
            assert self.w.http is not None
            headers = {"OpenStack-API-Version": f"compute {version}"} if version else {}
            response = await self.w.http.request(method, path, json=body, headers=headers)
            status = response.status_code
            self.answers.append((what, status))
            request_id = response.headers.get("x-openstack-request-id")
            if request_id is not None:
                self.answered_ids.append((what, request_id, status))
            if what == "create" and status == 202:
                self.created.add(UUID(response.json()["server"]["id"]))
            if target is not None:
                self.deletes_answered[target] = self.deletes_answered.get(target, 0) + 1
                # Once a delete was accepted the server must go, whatever a later delete
                # of it answers (a 503 then says that that request did nothing). A soft
                # delete too: settling passes the reclaim interval.
                if not gone_before and self.deletes.get(target) not in (202, 204):
                    self.deletes[target] = status
            if restore_of is not None and status == 202:
                # A restore accepted brings back a server soft-deleted: the deletes before
                # it no longer say it must go.
                self.deletes.pop(restore_of, None)
            if judged is not None:
                self.restores_unanswered[judged] -= 1
                if status in (202, 503):
                    self.restores[judged] = status
            # 503 is an answer ("nothing will happen", checked at quiescence); 5xx else never.
            if status >= 500 and status != 503:
                self.observer.api_errors.append(
                    f"I0 {what} answered {status}: {response.text[:300]}"
                )
            return response

        steps = dict(plan or {})
        casts_fail = steps.pop("casts_fail", None)

        async def go() -> None:
            if not self.w.api.alive:
                await self.w.start_api()
            if casts_fail is not None and self.w.api.transport is not None:
                # Every attempt keel-api makes at the request's cast fails (perhaps after
                # the message went out): it withdraws what it can and answers 503.
                for _ in range(publish.ATTEMPTS):
                    self.w.api.transport.fail_next_cast(delivered=casts_fail)
            self.rt.start(self.w.api, what, request, **steps)

        self.act(go())

    async def _gone(self, server: UUID) -> bool:
        async with self.w.db.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT deleted_at IS NOT NULL FROM instances WHERE uuid = $1", server
                )
            )

    async def _soft_deleted(self, server: UUID) -> bool:
        async with self.w.db.acquire() as conn:
            state = await conn.fetchval(
                "SELECT vm_state FROM instances WHERE uuid = $1 AND deleted_at IS NULL", server
            )
        return bool(state == "soft-delete")

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

    async def _start(self, start: Any) -> None:
        start()

    async def _heal(self, host: Host, **plan: Any) -> None:
        host.cut_for = None
        process = self.w.agent(host)
        if process is None:
            return
        process.cut = False
        self.w.heartbeat(host)
        await self.rt.idle()
        contact = self.w.agent_objects[host.index].contact
        self.rt.start(process, f"reconnect of {host.name}", contact.tick, **plan)

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

    def claimed_nodes(self, i: int = 0) -> list[int]:
        """The nodes server i holds claims on, as the database has them now."""

        async def read() -> list[int]:
            async with self.w.db.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT compute_node_id FROM allocations WHERE instance_uuid = $1 ORDER BY 1",
                    self.server(i),
                )
            return [r["compute_node_id"] for r in rows]

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
        if not self.started:
            return  # no step ran: no cloud was started, nothing to settle
        try:
            problems = self.run(self.settle())
            problems += self.run(self.observer.at_quiescence())
            problems += self.run(self.answered_problems())
            if problems and TRACE:
                print("model: at quiescence:", *problems, sep="\n  ")
            self.failed(problems)
            assert not problems, "at quiescence:\n" + "\n".join(problems)
        finally:
            self.run(self.w.stop())

    async def answered_problems(self) -> list[str]:
        """I0 at quiescence: 503 meant nothing happened, 202 that it did."""
        async with self.w.db.acquire() as conn:
            rows = await conn.fetch(
                "SELECT uuid, deleted_at IS NOT NULL AS gone, vm_state FROM instances"
            )
        deleted = {r["uuid"] for r in rows if r["gone"]}
        soft_deleted = {r["uuid"] for r in rows if r["vm_state"] == "soft-delete"}
        live = {r["uuid"] for r in rows} - deleted
        creates = sum(1 for what, _ in self.answers if what == "create")
        cut = self.creates_sent - creates  # no answer: the client cannot tell
        problems = []
        unasked = live - self.created
        if len(unasked) > cut:
            problems.append(f"I0 servers exist that no create was answered 202 for: {unasked}")
        for server, status in self.deletes.items():
            cut_off = self.deletes_sent.get(server, 0) > self.deletes_answered.get(server, 0)
            if status == 503 and server in deleted and not cut_off:
                problems.append(f"I0 server {server} was deleted although its delete got 503")
            if status in (202, 204) and server not in deleted:
                problems.append(f"I0 server {server} lives although its delete got {status}")
        for server, status in self.restores.items():
            if status == 202 and (server in deleted or server in soft_deleted):
                problems.append(f"I0 server {server} is not back although its restore got 202")
            cut_off = self.restores_unanswered.get(server, 0) > 0  # that one may have happened
            if status == 503 and not cut_off and server not in deleted | soft_deleted:
                problems.append(f"I0 server {server} is back although its restore got 503")
        return problems + await self._withdrawals_answered()

    async def _withdrawals_answered(self) -> list[str]:
        """I0 by the record of each request: one answered 2xx was never withdrawn (that
        would be a request keel dropped after it promised it), and one answered 503 left
        no action that was not withdrawn (an agent may take, and act on, only those). A
        create answered 503 is judged by its server instead: withdrawn, the server is
        deleted (its action closed, not withdrawn)."""
        async with self.w.db.acquire() as conn:
            rows = await conn.fetch(
                """SELECT request_id, action, bool_or(withdrawn_at IS NOT NULL) AS withdrawn,
                          bool_or(withdrawn_at IS NULL) AS standing
                     FROM instance_actions WHERE request_id = ANY($1::text[])
                    GROUP BY request_id, action""",
                [request_id for _, request_id, _ in self.answered_ids],
            )
        recorded: dict[str, list[asyncpg.Record]] = {}
        for row in rows:
            recorded.setdefault(row["request_id"], []).append(row)
        problems = []
        for what, request_id, status in self.answered_ids:
            for row in recorded.get(request_id, []):
                if 200 <= status < 300 and row["withdrawn"]:
                    problems.append(
                        f"I0 {what} ({request_id}) answered {status}, but its "
                        f"{row['action']} action was withdrawn"
                    )
                if status == 503 and row["standing"] and what != "create":
                    problems.append(
                        f"I0 {what} ({request_id}) answered 503, but its {row['action']} "
                        "action stands (not withdrawn)"
                    )
        return problems

    async def settle(self) -> list[str]:
        """Everything delivered and resumed, every host back, every deadline passed; what
        still would not drain after :data:`SETTLE_ROUNDS` rounds is a problem (I4)."""
        w, rt = self.w, self.rt
        w.seed(1000 + self.steps)
        for host in w.hosts:
            if host.cut_for is not None:
                await self._heal(host)
        for round_ in range(SETTLE_ROUNDS):
            if round_ == 1:
                self._disarm_faults()
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
            await self.force_up()
            await w.pass_time(PAST_EVERY_DEADLINE)
            for host in w.hosts:
                w.watch(host)
            await self.drain()
            w.sweep()
            await self.drain()
            for host in w.hosts:
                w.reconcile(host)
            await self.drain()
            # An agent that could not start this round (its conductor's database was out
            # while it registered) starts in the next: its guests are not reconciled yet.
            down = [h for h in w.hosts if not h.gone and w.agent(h) is None]
            if (
                not await self._held()
                and not rt.paused()
                and not down
                and not await self._waiting_on_time()
            ):
                return []
        held = [h.message.body[:80].decode(errors="replace") for h in await self._held()]
        return [
            f"I4 the cloud did not drain in {SETTLE_ROUNDS} rounds: {len(held)} message(s) "
            f"held ({held[:3]}), {len(rt.paused())} activity(ies) paused, agents of "
            f"{[h.name for h in w.hosts if not h.gone and w.agent(h) is None]} not running"
        ]

    def _disarm_faults(self) -> None:
        """The casts, calls, connections and commits armed to fail that have not met their
        fault by the end of the first round will not: what failed for a while works
        again, and the cloud is judged on whether it drains then. (Left armed, faults of
        one process that casts once a round — the reclaim's sweep — would outlast every
        round.)"""
        processes = [self.w.api, self.w.conductor, self.w.scheduler, *self.w.agents.values()]
        for process in processes:
            if process.alive and process.transport is not None:
                process.transport.disarm_faults()
        for process in (self.w.api, self.w.conductor, self.w.scheduler):
            if process.pool is not None:
                process.pool.outage = process.pool.lost_commits = 0

    async def _held(self) -> list[HeldMessage]:
        """The messages still held, but those in the queue of a compute service deleted
        for good: its host is gone, so no agent will ever consume them (the queue is left
        on the broker, and nothing of keel waits for what is in it)."""
        held = self.rt.broker.held
        gone = [host.name for host in self.w.hosts if host.gone]
        if not held or not gone:
            return list(held)
        async with self.w.db.acquire() as conn:
            rows = await conn.fetch(
                """SELECT uuid FROM services WHERE "binary" = 'keel-compute'
                     AND host = ANY($1::text[]) AND deleted_at IS NOT NULL""",
                gone,
            )
        dead = {topic_for(row["uuid"]) for row in rows}
        return [h for h in held if h.topic not in dead]

    async def _waiting_on_time(self) -> bool:
        """Whether something ended the last round waiting on a deadline of its own: a move
        that reached ``finished`` only after that round's time passed waits for its
        confirm window, a soft-deleted server whose reclaim could not be sent and a server
        whose delete no agent took (its sending again failed) wait for the next sweep;
        another round passes them. (An evacuation ``done`` waits for its source's agent,
        not for time: a host gone for good leaves it so.)"""
        async with self.w.db.acquire() as conn:
            waiting: bool = await conn.fetchval(
                """SELECT EXISTS (SELECT 1 FROM migrations
                                   WHERE status <> ALL($1::text[]) AND status <> 'done')
                       OR EXISTS (SELECT 1 FROM instances
                                   WHERE (vm_state = 'soft-delete' OR task_state = 'deleting')
                                     AND deleted_at IS NULL)""",
                list(states.TERMINAL),
            )
        return waiting

    async def force_up(self) -> None:
        """The operator brings every host forced down back up once its agent runs (keel-api
        may refuse while it has evacuations to confirm: the next round asks again)."""
        if not self.w.api.alive:
            await self.w.start_api()
        assert self.w.http is not None
        async with self.w.db.acquire() as conn:
            forced = {
                r["host"]: r["uuid"]
                for r in await conn.fetch(
                    """SELECT host, uuid FROM services WHERE "binary" = 'keel-compute'
                         AND deleted_at IS NULL AND forced_down"""
                )
            }
        for host in self.w.hosts:
            service = forced.get(host.name)
            if service is None or host.gone or self.w.agent(host) is None:
                continue
            await self.w.http.put(
                f"/v2.1/os-services/{service}",
                json={"forced_down": False},
                headers={"OpenStack-API-Version": "compute 2.53"},
            )
        await self.rt.idle()

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
