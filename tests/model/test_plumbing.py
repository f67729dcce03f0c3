"""The model's own shortcuts judge and run exactly what keel's code would.

The per-step check reads usage against claims with a query of its own (one statement
with everything else it reads); RPC servers in the model read their endpoint's routes
once per class; a step that ran nothing is not checked again. Each is held here to what
it stands for.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import asyncpg
import pytest

from services.compute.manager import ComputeManager
from services.compute.rpcapi import topic_for
from shared.db import allocations
from shared.rpc import server
from tests.model.conftest import routes_once_per_class
from tests.model.invariants import snapshot
from tests.model.machine import KeelMachine
from tests.model.script import A, Steps
from tests.model.world import RECLAIM_INTERVAL

pytestmark = pytest.mark.functional


def test_the_checks_drift_is_keels_own(m: KeelMachine) -> None:
    """A node whose usage is off by one shows in the check's read as keel reports it."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()

    async def read() -> tuple[list[allocations.UsageDrift], list[allocations.UsageDrift]]:
        async with m.w.db.acquire() as conn:
            await conn.execute(
                "UPDATE compute_nodes SET vcpus_used = vcpus_used + 1, memory_mb_used = 7 "
                "WHERE id = (SELECT min(id) FROM compute_nodes WHERE deleted_at IS NULL)"
            )
            snap = await snapshot(conn)
            return snap.drift, await allocations.usage_drift(conn)

    seen, keels = m.run(read())
    assert keels, "the corrupted node drifts"
    assert seen == keels
    problems = m.runner.run(m.observer.after_step())
    assert any(p.startswith("I1 usage is not the sum of claims") for p in problems), problems


def test_routes_read_once_are_bound_to_each_endpoint() -> None:
    """The routes of a second endpoint of a class are its own methods, with the request
    models keel reads, not the first endpoint's."""
    reads: list[object] = []

    def keels_reading(endpoint: object) -> dict[str, Any]:
        reads.append(endpoint)
        return server._routes(endpoint)

    read = routes_once_per_class(keels_reading)
    first = ComputeManager.__new__(ComputeManager)
    second = ComputeManager.__new__(ComputeManager)
    read(first)
    mine = read(second)
    assert reads == [first], "the second endpoint's routes come from the first reading"
    keels = server._routes(second)
    assert mine
    assert set(mine) == set(keels)
    for name, route in mine.items():
        assert isinstance(route.func, types.MethodType), name
        assert route.func.__self__ is second, name
        assert route.func.__func__ is getattr(keels[name].func, "__func__", None), name
        assert route.request is keels[name].request, name


def test_a_step_that_ran_nothing_is_not_checked_again(m: KeelMachine) -> None:
    """Only a step that ran something on the world's loop is checked: a fault armed for
    later is checked with the step that trips it."""
    m.every_step()
    checked = m.checked_at_run
    m.database_outage("api", 1)  # armed only
    m.every_step()
    assert m.checked_at_run == checked
    m.create(on=A)  # trips it: the API answers 503, and the step is checked
    m.every_step()
    assert m.checked_at_run == m.runs > checked
    assert ("create", 503) in m.answers
    m.teardown()


def test_a_message_in_the_queue_of_a_service_deleted_for_good_is_not_left_undone(
    m: KeelMachine,
) -> None:
    """A build's acknowledgement was lost and its agent killed before the message came
    round again; its host's service is deleted for good once the server is. No agent will
    ever consume that queue and nothing of keel waits for it: the settle does not count
    the message as work left undone (I4) — but it does while the service exists."""
    m.create(on=2)
    m.every_step()
    m.deliver_oldest()  # the conductor's: scheduled, the build cast to the agent
    m.every_step()
    service = m.run(m._service_uuid(m.host(2)))
    assert service is not None
    assert [h.topic for h in m.rt.broker.held] == [topic_for(service)]
    m.deliver(k=0, lose_ack=True)  # built; the message returns to its queue
    m.kill_agent(2)
    m.deliver_all()  # the build's result: the server ACTIVE
    m.advance(3601.0)
    m.every_step()
    m.delete(0)  # its host is down: deleted without the agent
    m.every_step()
    left = [h.topic for h in m.rt.broker.held]
    assert left == [topic_for(service)]
    assert [h.topic for h in m.run(m._held())] == left
    m.delete_service(2)
    m.every_step()
    assert m.answers[-2:] == [("delete", 204), ("service delete", 204)]
    assert [h.topic for h in m.rt.broker.held] == left
    assert m.run(m._held()) == []
    m.teardown()


def test_a_delete_of_a_server_already_gone_promises_nothing(m: KeelMachine) -> None:
    """A server whose create keel-api withdrew (503) is gone; a force-delete of it during
    a database outage answers 503 too, and I0 does not count the server's being gone
    against that 503 (the search, seed 1671428202, stopped on it). A delete that found
    its server still there keeps its promise: see finding 18's examples."""
    s = Steps(m)
    s.create(plan={"casts_fail": True})
    assert m.answers == [("create", 503)]
    assert m.state_of(0)[0] == "deleted"
    s.database_outage("api", 3)
    s.deferred_delete(0, "forceDelete")
    assert m.answers[-1] == ("forceDelete", 503)
    m.teardown()


def test_a_moves_claim_before_its_destination_is_recorded_may_be_anywhere(
    m: KeelMachine,
) -> None:
    """A live migration's conductor handler paused after the scheduler claimed its
    destination, before the conductor recorded it (the search, seed 3830007340): the
    claim is on a node the move does not name yet, as a build's is. The per-step I1
    allows it; the move's deadline or its resumption settles it."""
    s = Steps(m)
    s.boot()
    s.live_migrate(0, force=False, plan={}, to=None)
    m.deliver(0, lose_ack=False, plan={"pause_at": 8})
    m.every_step()

    async def move() -> tuple[str, int | None]:
        async with m.w.db.acquire() as conn:
            row = await conn.fetchrow("SELECT status, dest_compute_id FROM migrations")
        assert row is not None
        return row["status"], row["dest_compute_id"]

    assert m.run(move()) == ("accepted", None)
    m.teardown()


def test_a_delete_cut_off_after_its_cast_may_delete_whatever_a_later_one_answers(
    m: KeelMachine,
) -> None:
    """A delete paused after sending its terminate, then cut off with its keel-api
    (killed during another delete), never answered: its delete may happen. A third
    delete, withdrawn (503), did nothing — and I0 does not count the server's being
    deleted against it (the search, seed 3423950737, stopped on it)."""
    s = Steps(m)
    s.boot()
    s.delete(0, plan={"pause_at": 12})
    assert m.state_of(0)[:2] == ("active", "deleting")
    s.delete(0, plan={"kill_at": 1})
    s.delete(0, plan={"casts_fail": False})
    assert [a for a in m.answers if a[0] == "delete"] == [("delete", 503)]
    m.teardown()
    assert m.state_of(0)[0] == "deleted"


def test_the_settle_waits_for_an_agent_that_could_not_start(m: KeelMachine) -> None:
    """A server deleted without its agent while its host was down (crashed and forced
    down); at the settle the host's agent could not register at first (its conductor's
    database refused the connections), so its guests were not reconciled and the
    deleted server's guest stayed (the search, seed 1586215118, reported I2). The settle
    runs another round until every agent of a host not gone runs."""
    s = Steps(m)
    s.boot(on=A)
    s.crash(A, force_down=True)
    s.delete(0)
    assert m.state_of(0)[0] == "deleted"
    s.database_outage("conductor", 4)
    m.teardown()  # I2: the deleted server's guest on A is removed once A's agent runs


def test_database_steps_are_answered_in_the_order_they_were_asked(m: KeelMachine) -> None:
    """Two processes' statements at once: the slow one asked first is answered first,
    so an example replays the same; one waiting on a row lock the other holds between
    two statements of its transaction is let past, not left to hang."""
    s = Steps(m)
    s.create(on=A)
    answered: list[str] = []

    async def ask(pool: Any, name: str, sql: str) -> None:
        async with pool.acquire() as conn:
            await conn.fetchval(sql)
        answered.append(name)

    async def both() -> None:
        await asyncio.gather(
            ask(m.w.api.db, "slow", "SELECT pg_sleep(0.05)"),
            ask(m.w.conductor.db, "quick", "SELECT 1"),
        )

    async def locked() -> None:
        async with m.w.api.db.acquire() as holder, holder.transaction():
            await holder.execute("UPDATE instances SET updated_at = now()")
            waiter = asyncio.create_task(
                ask(m.w.conductor.db, "waited", "UPDATE instances SET updated_at = now()")
            )
            await asyncio.sleep(0.05)
            await holder.execute("SELECT 1")  # its next step, behind the blocked one
        await waiter

    let_past = m.w.rt.inflight.let_past
    m.run(both())
    m.run(locked())
    assert answered == ["slow", "quick", "waited"]
    assert m.w.rt.inflight.let_past == let_past + 2  # its next statement, and its commit


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_a_restore_answered_202_must_bring_its_server_back(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """I0 for restores: a server whose restore was answered 202 (no delete sent after it)
    that is soft-deleted at quiescence is a problem; back, it is none."""
    s = Steps(m)
    s.boot(on=A)
    s.delete(0)
    s.deliver_all()
    s.deferred_delete(0, "restore")
    s.deliver_all()
    assert m.answers[-1] == ("restore", 202)
    assert m.run(m.answered_problems()) == []

    async def soft_delete_again() -> None:
        async with m.w.db.acquire() as conn:
            await conn.execute(
                "UPDATE instances SET vm_state = 'soft-delete' WHERE uuid = $1", m.server(0)
            )

    m.run(soft_delete_again())
    problems = m.run(m.answered_problems())
    assert problems == [f"I0 server {m.server(0)} is not back although its restore got 202"]


def test_a_commit_whose_answer_is_lost_is_done_and_raises(m: KeelMachine) -> None:
    """What ``commit_answer_lost`` arms: the next outermost commit of the process happens,
    then its caller sees the connection drop; a nested one (a savepoint) and later ones
    are left alone."""
    s = Steps(m)
    s.create(on=A)
    m.w.conductor.pool.lost_commits += 1

    async def tag(name: str) -> None:
        async with m.w.conductor.db.acquire() as conn, conn.transaction(), conn.transaction():
            await conn.execute("UPDATE instances SET display_name = $1", name)

    async def names() -> set[str]:
        async with m.w.db.acquire() as conn:
            return {
                r["display_name"] for r in await conn.fetch("SELECT display_name FROM instances")
            }

    async def scenario() -> tuple[str, set[str], set[str]]:
        try:
            await tag("lost")
            raised = "nothing"
        except asyncpg.ConnectionDoesNotExistError:
            raised = "lost"
        first = await names()
        await tag("kept")
        return raised, first, await names()

    assert m.run(scenario()) == ("lost", {"lost"}, {"kept"})
