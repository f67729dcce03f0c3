"""The model's findings about moves and fences, as explicit examples: evacuations,
cold and live migrations, resizes, hosts cut off, crashed or deleted, agents that die.

Each test runs the model's own steps in order — the same rules Hypothesis draws — with
every invariant checked after each step and at quiescence (the machine's teardown), plus
what the finding is about, asserted at the end. A finding still open is marked with
:func:`tests.model.known.xfail_until_fixed` (strict: its fix must remove the mark). The
other families are in ``test_findings_builds.py``, ``test_findings_requests.py`` and
``test_findings_resets.py``; ``docs/model.md`` lists every finding.
"""

from __future__ import annotations

import pytest

from shared.versions import HOST_FENCE_VERSION
from tests.model import known
from tests.model.machine import KeelMachine
from tests.model.script import LEASE_RUNS_OUT, A, B, Steps, past_the_lease
from tests.model.world import BIG_FLAVOR

pytestmark = pytest.mark.functional


def on_a_then_evacuated_to_b(s: Steps) -> None:
    """A server built on A; A crashes and the server is evacuated to B (once A's fence
    lease has run out); A comes back."""
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    s.deliver_all()
    assert s.m.state_of(0) == ("active", "rebuilding", "host0")  # held for A's fence
    past_the_lease(s)
    assert s.m.state_of(0) == ("active", None, "host1")
    s.start_agent(A)  # its first guest report removes the evacuated copy
    s.force_down(A, down=False)
    s.deliver_all()


def test_finding_1_evacuated_back_to_the_first_host_keeps_its_copy(m: KeelMachine) -> None:
    """Finding 1: evacuate A→B, A returns, then B→A; A's guest report must keep the copy."""
    s = Steps(m)
    on_a_then_evacuated_to_b(s)
    s.crash(B, force_down=True)
    s.evacuate(0, to=A)
    assert s.deliver_named("evacuate_instance")  # held: B's fence lease still runs
    s.advance(LEASE_RUNS_OUT)
    s.sweep()
    assert s.deliver_named("evacuate_instance")
    assert s.deliver_named("rebuild_instance", A)  # A builds it; its result is held
    s.guest_report(A)  # while the move is in flight: the new copy must stay
    s.deliver_all()
    s.guest_report(A)
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()


def test_finding_1_migrated_back_to_the_first_host_keeps_its_copy(m: KeelMachine) -> None:
    """Finding 1, cold migration: evacuate A→B, A returns, migrate B→A, confirm."""
    s = Steps(m)
    on_a_then_evacuated_to_b(s)
    s.migrate(0, to=A)
    assert s.deliver_named("migrate_instance")
    s.deliver_named("prepare_migration")
    assert s.deliver_named("rebuild_instance", A)
    s.guest_report(A)
    s.deliver_all()
    assert m.state_of(0)[0] == "resized"
    s.finish_resize(0, confirm=True)
    s.deliver_all()
    s.guest_report(A)
    s.guest_report(B)
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()


def test_finding_2_a_destination_never_adopts_a_stale_copy(m: KeelMachine) -> None:
    """Finding 2: a copy a timed-out move left on B is not adopted by the next move to B."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.migrate(0, to=B)
    assert s.deliver_named("migrate_instance")
    assert s.deliver_named("rebuild_instance", B)  # B built it (move M1); result held
    s.crash(B, force_down=False)  # its copy stops with it
    s.advance(3601.0)
    s.sweep()  # M1 is past its deadline: error, the server back on A
    s.deliver_all()
    s.start_agent(B)  # B's copy of M1 is explained by no live move: kept, as an orphan
    s.deliver_all()
    s.migrate(0, to=B)  # M2: B must not take M1's copy for its own
    s.deliver_all()
    m.teardown()  # I2: the copy the server lives on was made by its last move


def test_finding_14_a_timed_out_migration_never_runs_two_copies(m: KeelMachine) -> None:
    """Finding 14: B built the copy and its agent died (the guest runs on); B keeps no
    host fence (its agents run the release before fences). The migration is past its
    deadline. Starting the source copy again would make two running copies: the server
    stays SHUTOFF on A, and starting it is refused until B is forced down."""
    s = Steps(m)
    m.restart_as(HOST_FENCE_VERSION - 1)
    s.create(on=A)
    s.deliver_all()
    s.migrate(0, to=B)
    assert s.deliver_named("migrate_instance")
    assert s.deliver_named("rebuild_instance", B)  # B runs the copy of M1; result held
    s.kill_agent(B)  # the agent only: B's hypervisor runs on, and it cannot fence itself
    s.advance(3601.0)
    s.sweep()  # I2: the deadline must not start A's copy while B's may run
    s.deliver_all()
    assert m.state_of(0) == ("stopped", None, "host0")
    s.power(0, "os-start")
    assert ("os-start", 409) in m.answers
    s.crash(B, force_down=True)  # B's host is off, and the operator says so
    s.power(0, "os-start")
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()


def test_finding_14_a_timed_out_evacuation_never_runs_two_copies(m: KeelMachine) -> None:
    """Finding 14, evacuation: B runs the copy and its agent died (no host fences: the
    release before them); past the deadline the server is ERROR on A; A comes back and
    the server is hard-rebooted there."""
    s = Steps(m)
    m.restart_as(HOST_FENCE_VERSION - 1)
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    assert s.deliver_named("evacuate_instance")
    assert s.deliver_named("rebuild_instance", B)  # B runs the copy; result held
    s.kill_agent(B)  # B is not fenced: its guest may run
    s.advance(3601.0)
    s.sweep()  # the evacuation is past its deadline: the server ERROR, on A
    s.deliver_all()
    s.bring_back(A)
    s.power(0, "hard")  # I2: must not start A's copy while B's may run
    s.deliver_all()
    assert ("hard", 409) in m.answers
    assert m.state_of(0) == ("error", None, "host0")
    s.start_agent(B)  # its first guest report stops the stray copy
    s.deliver_all()
    s.power(0, "hard")
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()


@pytest.mark.parametrize("confirm", [True, False])
def test_a_resize_confirmed_or_reverted_keeps_one_copy_and_its_claims(
    m: KeelMachine, confirm: bool
) -> None:
    """A resize (a cold migration with a new flavor) ends on one copy, claimed once, with
    the flavor it ended with, through the invariants of every step."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.resize(0, BIG_FLAVOR)
    s.deliver_all()
    assert m.state_of(0)[:2] == ("resized", None)
    s.finish_resize(0, confirm=confirm)
    s.deliver_all()
    assert m.state_of(0)[:2] == ("active", None)
    assert (m.state_of(0)[2] == "host0") is not confirm
    m.teardown()


def test_finding_3_a_host_gone_for_good_is_deleted(m: KeelMachine) -> None:
    """Finding 3: once its servers are evacuated, a dead host's service can be deleted."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    s.deliver_all()
    past_the_lease(s)  # A's fence lease ran out: the evacuation went on
    s.delete_service(A)
    assert ("service delete", 204) in m.answers
    assert m.w.hosts[A].gone
    m.teardown()  # I1 at quiescence: nothing stays claimed on A


def test_finding_4_delete_during_a_cold_migration_ends_it(m: KeelMachine) -> None:
    """Finding 4: a delete during a move ends the move, both copies and both claims."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.migrate(0, to=B)
    assert s.deliver_named("migrate_instance")
    s.delete(0)
    s.deliver_all()  # the move's late result finds the server deleted
    assert m.moves_of(0) == ["cancelled"]  # ended by the delete, not by a deadline
    m.teardown()  # I4: no record left pre-migrating; I1, I2: no claim, no copy


def test_finding_4_delete_while_the_destination_builds(m: KeelMachine) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.migrate(0, to=B)
    assert s.deliver_named("migrate_instance")
    s.deliver_named("prepare_migration")
    assert s.deliver_named("rebuild_instance", B, pause_at=1)  # B stops mid-rebuild
    s.delete(0)
    s.resume(0)
    s.deliver_all()
    assert m.moves_of(0) == ["cancelled"]
    m.teardown()


def test_finding_4_a_destination_killed_mid_move_is_past_its_deadline(m: KeelMachine) -> None:
    """Finding 4: the destination dies mid-rebuild and never returns: the move's deadline."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    assert s.deliver_named("evacuate_instance")  # held for A's fence
    s.advance(LEASE_RUNS_OUT)
    s.sweep()
    assert s.deliver_named("evacuate_instance")
    assert s.deliver_named("rebuild_instance", B, kill_at=1)  # B dies as it starts
    s.crash(B, force_down=True)
    s.advance(3601.0)
    s.sweep()
    assert m.state_of(0)[1] is None  # the move's deadline cleared the task
    m.teardown()


def test_a_host_cut_off_is_evacuated_only_once_fenced_and_never_runs_a_second_copy(
    m: KeelMachine,
) -> None:
    """Issue 23: cut off, A fences itself before keel lets the server be evacuated; after
    the heal A reconciles first, removing its old copy, and never starts it."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.cut(A)
    s.advance(seconds=30.0)  # past the down time, not past A's window: no evacuation yet
    s.evacuate(0, to=B)
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host0")
    s.advance(seconds=3601.0)  # A has fenced itself: its guest is off, keel may evacuate
    assert not m.host(A).driver.running()
    s.evacuate(0, to=B)
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host1")
    s.heal(A)
    s.deliver_all()
    assert m.host(A).driver.guests() == set(), "the evacuated copy went, never started"
    m.teardown()


@known.xfail_until_fixed(known.DEAD_AGENT_EVACUATED, "a dead agent's host counts as fenced")
@pytest.mark.parametrize("force_down", [False, True])
def test_finding_17_a_host_whose_agent_died_is_never_evacuated_beside_its_guest(
    m: KeelMachine, force_down: bool
) -> None:
    """Finding 17: A's agent is killed (its own process only: the host and its guest run
    on); an hour later, or forced down by an operator, the server is evacuated to B. The
    copy on A must be off before B's starts: A's fence powers it off once its lease runs
    out, and the evacuation waits for that."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.kill_agent(A)
    if force_down:
        s.force_down(A, down=True)
    s.advance(3601.0)
    s.evacuate(0, to=B)
    s.deliver_all()
    m.teardown()  # I2: never two running copies


def test_finding_17_a_host_forced_down_at_once_is_evacuated_once_its_lease_ran_out(
    m: KeelMachine,
) -> None:
    """Finding 17, forced down at once: A's agent is killed and the operator forces A down
    and evacuates the server straight away. A's fence still holds its lease: B builds the
    copy only once the lease has run out and A's guest is off."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.kill_agent(A)
    s.force_down(A, down=True)
    s.evacuate(0, to=B)
    s.deliver_all()  # I2: never two running copies
    assert m.state_of(0) == ("active", "rebuilding", "host0")  # held for A's fence
    past_the_lease(s)
    assert m.state_of(0) == ("active", None, "host1")
    m.teardown()


def test_finding_22_a_migration_rebuild_delivered_after_its_deadline_builds_nothing(
    m: KeelMachine,
) -> None:
    """Finding 22 (the randomized partition run's two copies): the rebuild of a cold
    migration reached B only after the move deadline had ended the move and started the
    source's copy again; B built a second running copy. B now asks first."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.migrate(0, to=B)
    assert s.deliver_named("migrate_instance")  # the rebuild to B is held
    s.advance(3601.0)
    s.sweep()  # the deadline: back on A, running
    assert m.state_of(0) == ("active", None, "host0")
    assert s.deliver_named("rebuild_instance", B)  # I2: never a copy on B beside A's
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()


def test_finding_38_a_timed_out_migration_leaves_a_server_that_moved_on(m: KeelMachine) -> None:
    """Finding 38 (found by the search, seed 1217687537, example 395): a migration not
    yet begun (its cast held) whose server an admin reset to ACTIVE; the host then
    crashed and the server was evacuated. The migration, timed out, put the server back
    "on its source": it asked the crashed host to start the guest there and, failing,
    put the server — ACTIVE on the evacuation's host — in ERROR. A move's deadline leaves
    a server no longer on its source as it is."""
    s = Steps(m)
    s.boot()
    s.migrate(0)
    s.reset_state(0, "active")
    s.evacuate_crashed(0)
    assert m.state_of(0)[:2] == ("active", None)
    m.teardown()  # I5: active → error is no transition a timed-out move may make


def test_finding_42_an_evacuation_is_confirmed_after_its_server_was_offloaded(
    m: KeelMachine,
) -> None:
    """Finding 42 (found by the search, seed 2316772573, example 2,037): evacuated from
    its crashed host, then shelved and offloaded before that host came back. The source's
    report found the server placed nowhere and called its old copy an orphan: the
    evacuation stayed ``done`` for ever (I4) and the copy was kept. An offloaded server's
    copy is its shelved image, so the evacuation's record says the old copy goes."""
    s = Steps(m)
    s.boot(on=A)
    s.evacuate_crashed(0, to=B)
    s.shelve(0, "shelve")
    s.deliver_all()
    assert m.state_of(0)[0] == "shelved_offloaded"
    m.teardown()  # I4: no evacuation left done; I2: the offloaded server has no guest


def test_finding_56_an_evacuation_is_confirmed_after_a_move_back_to_its_source_failed(
    m: KeelMachine,
) -> None:
    """Finding 56 (found by the search, seed 3091397505, example 1,911): evacuated from
    its crashed host B, then live-migrated back to B (forced) while B was still down: the
    live migration failed. B's report, by the records, took the failed move for the last
    word on B and called the evacuation's old copy an orphan: the evacuation stayed
    ``done`` for ever (I4) and B kept the server's claim (I1). The copy carries the token
    the evacuation's source copy carried, so it is that copy and goes; the evacuation is
    confirmed."""
    s = Steps(m)
    s.boot_delivered_again(after=1, copies=1, failing=False, on=None, results=2)
    s.evacuate_crashed(i=0, to=None)
    s.deliver_all()
    s.deliver_all()
    s.live_migrate(force=True, i=0, plan={}, to=B)
    s.deliver_all()
    s.deliver_all()
    m.teardown()
