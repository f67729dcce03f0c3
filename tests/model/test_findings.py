"""The findings of issue 21 (and what the search found since), as explicit examples.

Each test runs the model's own steps in order — the same rules Hypothesis draws — with
every invariant checked after each step and at quiescence (the machine's teardown), plus
what the finding is about, asserted at the end. A finding still open is marked with
:func:`tests.model.known.xfail_until_fixed` (strict: its fix must remove the mark).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from shared.versions import HOST_FENCE_VERSION, TAKING_REQUESTS_VERSION
from tests.model import known
from tests.model.machine import KeelMachine
from tests.model.script import LEASE_RUNS_OUT, A, B, C, Steps, past_the_lease
from tests.model.world import BIG_FLAVOR, DOWN_TIME, RECLAIM_INTERVAL

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


@pytest.mark.parametrize("tokens", [True, False])
def test_finding_15_a_build_result_never_ends_a_delete(m: KeelMachine, tokens: bool) -> None:
    """Finding 15 (found by the search): the build reached A twice (a redelivery); the
    first spawn failed, the second ran the guest; the server is deleted before either
    result is recorded. The failure used to put the server in ERROR, clearing the delete's
    task (and the success then made it ACTIVE while the delete destroyed its guest).
    Without ``tokens``, A's agents run the release before copy tokens: their results say
    nothing of which guest they built, and the delete alone must keep them out."""
    s = Steps(m)
    if not tokens:
        m.restart_as(HOST_FENCE_VERSION - 1)
    s.create(on=A)
    assert s.deliver_named("build_instances")
    s.fail_next(A, "spawn")
    s.interleave(k=0, j=None, order=[])  # build_and_run_instance, twice
    assert m.state_of(0) == ("building", "spawning", "host0")
    s.delete(0)
    assert m.state_of(0) == ("building", "deleting", "host0")
    s.deliver_all()  # I5: building/deleting → only deleted
    assert ("delete", 204) in m.answers
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


@known.xfail_until_fixed(
    known.BUILD_DELIVERIES_RACE,
    "a delivery told to abandon the build discards the guest whose success is on its way",
)
def test_finding_16_a_failed_delivery_of_a_build_never_discards_the_guest_of_another(
    m: KeelMachine,
) -> None:
    """Finding 16 (found by the 5,000-example search): the build reached A three times; the
    first spawn failed, the second ran the guest, both reports held; the failure is
    recorded (ERROR), then the third delivery asked the conductor, was told to abandon
    the build and discarded the second's guest — whose success then made the server
    ACTIVE with no copy anywhere."""
    s = Steps(m)
    s.create(on=A)
    assert s.deliver_named("build_instances")
    s.fail_next(A, "spawn")
    s.duplicate(k=0)
    s.duplicate(k=0)
    assert s.deliver_named("build_and_run_instance", A)  # fails; its report held
    assert s.deliver_named("build_and_run_instance", A)  # runs the guest; report held
    assert s.deliver_named("instance_build_result")  # the failure: ERROR
    assert m.state_of(0) == ("error", None, "host0")
    assert s.deliver_named("build_and_run_instance", A)  # must not discard the guest
    s.deliver_all()
    assert m.state_of(0) == ("active", None, "host0")
    m.teardown()  # I2: exactly one copy of the live server


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


def test_finding_8_a_build_finishing_after_its_deadline_keeps_a_claim(m: KeelMachine) -> None:
    """Finding 8: a late build success after the build deadline leaves no claimless guest."""
    s = Steps(m)
    s.create(on=A)
    assert s.deliver_named("build_instances")
    assert s.deliver_named("build_and_run_instance", A)  # built; its result is held
    s.advance(601.0)
    s.sweep()  # the build deadline: ERROR, claims released
    s.deliver_all()  # the late result
    m.teardown()  # I1 and I2: a server with a copy holds its claim


def test_finding_8_a_create_withdrawn_after_its_build_claimed_a_node_gives_the_claim_back(
    m: KeelMachine,
) -> None:
    """Finding 8, the withdrawal: every attempt at a create's cast went out unconfirmed.
    Before keel-api withdrew the server, a conductor took one of the casts and the
    scheduler claimed a node; that conductor was killed before it recorded the placement.
    keel-api's withdrawal (the server never placed: 503) must give the claim back: the
    build, delivered again, finds the server deleted and does nothing."""
    s = Steps(m)
    for _ in range(3):
        s.cast_fails("api", delivered=True)
    s.create(plan={"pause_at": 11})  # all three casts out; the withdrawal is next
    assert [what for what, _ in m.answers] == []
    assert len(m.deliverable()) == 3
    assert s.deliver_named("build_instances", pause_at=6)  # the claim made, not recorded
    assert m.state_of(0) == ("building", "scheduling", None)
    assert m.claimed_nodes(0)
    s.kill_control("conductor")
    s.resume(0)  # keel-api withdraws the server
    assert ("create", 503) in m.answers
    m.teardown()  # I1: a deleted server holds no claim


def test_finding_8_a_build_that_claims_after_its_deadline_gives_the_claim_back(
    m: KeelMachine, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 8, the build deadline racing a build cut off after its claim: the conductor
    read the server as building; the deadline then put it in ERROR (nothing claimed yet);
    the scheduler claimed a node and the conductor's next database call failed, so the
    build went back to the queue unrecorded. Delivered again, it finds the server in
    ERROR, never placed, and gives back the claim its cut-off run made."""
    caplog.set_level(logging.INFO, logger="services.conductor.builds.task")
    s = Steps(m)
    s.create()
    assert s.deliver_named("build_instances", pause_at=5)  # before asking the scheduler
    assert not m.claimed_nodes(0)
    s.advance(601.0)
    s.sweep()  # the build deadline: ERROR, no claim to release yet
    assert m.state_of(0) == ("error", None, None)
    s.database_outage(count=1, who="conductor")
    s.resume(0)  # the scheduler claims; recording the placement fails
    # The handler runs again, at once or delivered later (its retry's pause is real
    # time): the claim is held until then, or that run found the server in ERROR and
    # gave it back already.
    given_back = [
        r
        for r in caplog.records
        if getattr(r, "decision", None) == "placement_lost" and "released" in r.getMessage()
    ]
    assert m.claimed_nodes(0) or given_back
    m.teardown()  # I1: a server never placed holds no claim


@pytest.mark.parametrize("delivered", [False, True])
def test_finding_9_a_delete_whose_cast_may_have_gone(m: KeelMachine, delivered: bool) -> None:
    """Finding 9: a delete whose publish failed, perhaps after the broker took it."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.cast_fails("api", delivered=delivered)
    s.delete(0)
    s.deliver_all()
    m.teardown()  # I2: a live server keeps its copy; a deleted one has none


@pytest.mark.parametrize("delivered", [False, True])
def test_finding_9_a_stop_whose_cast_may_have_gone(m: KeelMachine, delivered: bool) -> None:
    """Finding 9: a power action is never undone behind a message that was acted on."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.cast_fails("api", delivered=delivered)
    s.power(0, "os-stop")
    s.deliver_all()
    state = m.state_of(0)
    running = m.w.hosts[A].driver.running()
    # Whatever the API answered, the database and the host agree once all is delivered.
    assert (state[0] == "active") == bool(running), (state, running)
    m.teardown()


#: Every attempt fails before the message leaves, or after it went out unconfirmed.
UNSENT_OR_SENT = [False, True]


@pytest.mark.parametrize("delivered", UNSENT_OR_SENT)
def test_finding_9_a_delete_answered_503_deletes_nothing(m: KeelMachine, delivered: bool) -> None:
    """Finding 9: every attempt at the delete's cast fails (perhaps after it went out): 503,
    and whatever reaches the agent later must not delete the server."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    for _ in range(3):
        s.cast_fails("api", delivered=delivered)
    s.delete(0)
    assert ("delete", 503) in m.answers
    s.deliver_all()
    m.teardown()  # I0: a delete answered 503 left its server; I2: with its copy


@pytest.mark.parametrize("delivered", UNSENT_OR_SENT)
def test_finding_9_a_stop_answered_503_stops_nothing(m: KeelMachine, delivered: bool) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    for _ in range(3):
        s.cast_fails("api", delivered=delivered)
    s.power(0, "os-stop")
    assert ("os-stop", 503) in m.answers
    s.deliver_all()
    assert m.w.hosts[A].driver.running(), "a stop answered 503 stopped the guest"
    m.teardown()


def test_finding_9_a_stop_acted_on_after_its_task_was_cleared_is_recorded(m: KeelMachine) -> None:
    """Finding 9, its older half: the database said ACTIVE while the agent stopped the
    guest, and nothing re-synced the power state. A stop's task is cleared by its deadline
    before the agent got the message; the agent stops the guest all the same (its
    result finds no task to end). The host's next guest report, once the row has been
    quiet for a service down time, records the server as it runs: SHUTOFF."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.power(0, "os-stop")
    s.advance(601.0)
    s.sweep()  # KEEL_TASK_TIMEOUT: the task is cleared, the stop still held
    assert m.state_of(0) == ("active", None, "host0")
    s.deliver_all()  # the agent stops the guest
    assert not m.w.hosts[A].driver.running()
    s.advance(DOWN_TIME + 1)
    s.guest_report(A)
    assert m.state_of(0) == ("stopped", None, "host0")
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


# -- never two copies when an agent dies (issue 29) ------------------------------------


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


@known.xfail_until_fixed(known.WITHDRAWN_WITHOUT_CONDUCTOR, "an agent acts on what it cannot take")
def test_finding_18_a_delete_answered_503_deletes_nothing_while_no_conductor_answers(
    m: KeelMachine,
) -> None:
    """Finding 18 (finding 9's residue): every attempt at the delete's cast went out
    unconfirmed, keel-api withdrew it and answered 503; the conductor is killed, then
    the messages are delivered. The agent cannot take the request: it must not act."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    for _ in range(3):
        s.cast_fails("api", delivered=True)
    s.delete(0)
    assert ("delete", 503) in m.answers
    s.kill_control("conductor")
    s.deliver_all()
    m.teardown()  # I0: a delete answered 503 left its server; I3: and its copy


@known.xfail_until_fixed(known.WITHDRAWN_FROM_AN_OLD_AGENT, "keel-api withdraws from an old agent")
def test_finding_19_keel_api_never_withdraws_what_an_older_agent_acts_on(m: KeelMachine) -> None:
    """Finding 19: A's agent runs the release before requests were taken (a rolling
    upgrade); a delete's casts all go out unconfirmed. keel-api may answer 503 only if
    the agent cannot act on them: an older agent acts on whatever reaches it."""
    s = Steps(m)
    m.restart_as(TAKING_REQUESTS_VERSION - 1)
    s.create(on=A)
    s.deliver_all()
    for _ in range(3):
        s.cast_fails("api", delivered=True)
    s.delete(0)
    s.deliver_all()
    m.teardown()  # I0: 503 means nothing happened, 202 that it did


def test_finding_20_a_hard_reboot_is_never_a_server_error(m: KeelMachine) -> None:
    """Finding 20 (found by the search, seed 3413714510): a hard reboot, which may replace
    a soft one under way, made keel-api check every vm state with a soft reboot against
    the state table, though only an ACTIVE server has one: 500 instead of an answer."""
    s = Steps(m)
    s.create()
    s.deliver_all()
    s.power(0, "os-stop")
    s.deliver_all()
    s.power(0, "hard")
    s.deliver_all()
    assert m.state_of(0)[0] == "active"
    m.teardown()  # I0: no 5xx but 503


def test_finding_21_a_conductor_started_during_a_database_outage_waits_it_out(
    m: KeelMachine,
) -> None:
    """Finding 21 (found by the search in CI): keel-conductor, started again while its
    database could not be reached, exited at its first query; nobody took the builds
    queued for it. A service starting during an outage waits for the database."""
    s = Steps(m)
    s.database_outage(count=4, who="conductor")
    kills = m.w.conductor.kills
    s.kill_control("conductor")
    s.start_control("conductor")
    s.create()
    s.deliver_all()
    assert m.w.conductor.alive, "keel-conductor exited instead of waiting"
    assert m.w.conductor.kills == kills + 1, "keel-conductor exited, and started again"
    assert m.state_of(0)[0] == "active"
    m.teardown()  # I4: everything drains


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


def test_finding_23_a_server_never_built_is_never_reset_to_active(m: KeelMachine) -> None:
    """Finding 23 (found by the search, seed 3094276000): A's host crashed unnoticed; a
    build placed there never ran and the server went to ERROR; an admin reset it to
    ACTIVE, a server with no guest anywhere. keel-api refuses that reset (409)."""
    s = Steps(m)
    s.crash(A, force_down=False)
    s.create(on=A)
    s.deliver_all()
    s.advance(3601.0)
    s.sweep()
    assert m.state_of(0) == ("error", None, "host0")
    s.reset_state(0, "active")
    assert ("os-resetState", 409) in m.answers
    m.teardown()  # I2: a live server not in ERROR has its copy


def test_a_delete_repeated_during_an_outage_after_one_was_accepted(m: KeelMachine) -> None:
    """The search (seed 3614535924) flagged a server deleted although "its delete" got
    503: the model kept only the last answer. The first delete was accepted (204: the
    server was never placed); the second, during keel-api's database outage, answered 503
    — nothing that request did. The server must be gone (I0 holds the accepted one)."""
    s = Steps(m)
    s.create()
    s.delete(0)
    s.database_outage(count=1, who="api")
    s.delete(0)
    assert [status for what, status in m.answers if what == "delete"] == [204, 503]
    s.deliver_all()
    m.teardown()  # I0: deleted, as its accepted delete said


def test_finding_24_a_delete_cut_off_on_a_building_server_leaves_the_build_to_its_deadline(
    m: KeelMachine,
) -> None:
    """Finding 24 (found by the search, seed 2588669048): C's agent is dead, so its build
    waits; a delete of the server is cut off (keel-api killed) after marking it deleting.
    The task deadline cleared the delete to no task at all: the server stayed BUILD with
    nothing to end it (or, a pass later, went from building/none to ERROR, a transition
    outside the table). It now goes back to its build's task, and the build deadline
    ends it in the same pass."""
    s = Steps(m)
    s.kill_agent(C)
    s.create(on=C)
    s.deliver_all()
    assert m.state_of(0) == ("building", "spawning", "host2")
    s.delete(0, plan={"kill_at": 8})
    assert m.state_of(0) == ("building", "deleting", "host2")
    m.teardown()  # I4: nothing left building; I5: every transition in the table


@pytest.mark.parametrize("k", range(5, 12))
def test_finding_25_a_create_answered_503_leaves_no_server(m: KeelMachine, k: int) -> None:
    """Finding 25 (found by the search, seed 1740033742): every attempt at a create's cast
    went out unconfirmed, and keel-api's database went away meanwhile (paused at step k).
    Withdrawing the server, or reading the RPC pins for the next attempt, failed: 503,
    though the server was recorded and its build delivered. A create keel-api cannot
    withdraw is now accepted (202); one no conductor got ends in ERROR by its deadline."""
    s = Steps(m)
    for _ in range(3):
        s.cast_fails("api", delivered=True)
    s.create(plan={"pause_at": k})
    s.database_outage(count=2, who="api")
    s.resume(0)
    s.deliver_all()
    m.teardown()  # I0: servers exist only for creates answered 202 (or not answered)


def test_a_rebuild_overtaken_by_a_reset_and_a_migration_is_never_done(m: KeelMachine) -> None:
    """The search (seed 196833603): a rebuild accepted while no conductor ran waited on
    its host for its request to be taken; an admin reset the server to ACTIVE and migrated
    it. Once a conductor answered, the rebuild was no longer under way on that node: not
    taken, nothing rebuilt; the migration, finished only in the settle's last round, is
    confirmed by its window (the model's settle used to stop a round too early)."""
    s = Steps(m)
    s.create()
    s.deliver_all()
    s.kill_control("conductor")
    s.rebuild(0)
    s.deliver_all()
    s.reset_state(0, "active")
    s.migrate(0, None)
    assert [status for what, status in m.answers if what in ("rebuild", "migrate")] == [202, 202]
    m.teardown()  # I4: the migration ends; I2: one copy, on its destination


def test_finding_26_a_server_whose_build_failed_is_never_rebuilt_unclaimed(
    m: KeelMachine,
) -> None:
    """Finding 26 (the search, seed 260348930): a build failed on A, so the server went to
    ERROR and its claim was released; its owner rebuilt it, and A made a guest that ran
    on resources nobody had claimed (ACTIVE, no claim). keel-api refuses to rebuild a
    server that holds no claim on its node (409)."""
    s = Steps(m)
    s.fail_next(A, "spawn")
    s.create(on=A)
    s.deliver_all()
    assert m.state_of(0) == ("error", None, "host0")
    s.rebuild(0)
    s.deliver_all()
    assert ("rebuild", 409) in m.answers
    m.teardown()  # I1: a server's copy sits where it holds a claim


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
@pytest.mark.parametrize("delivered", UNSENT_OR_SENT)
def test_a_soft_delete_answered_503_keeps_the_server_running(
    m: KeelMachine, delivered: bool, reclaim_interval: float
) -> None:
    """Soft delete on: a DELETE whose soft delete cannot be sent is withdrawn (503) as a
    stop is, and whatever reaches the agent later powers nothing off."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    for _ in range(3):
        s.cast_fails("api", delivered=delivered)
    s.delete(0)
    assert ("delete", 503) in m.answers
    s.deliver_all()
    assert m.state_of(0)[:2] == ("active", None)
    assert m.w.hosts[A].driver.running(), "a soft delete answered 503 stopped the guest"
    m.teardown()


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_a_soft_deleted_server_restored_and_force_deleted_at_once_ends_one_way(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Soft delete on: restore and forceDelete of a SOFT_DELETED server, delivered in any
    order, leave one copy running with its claim, or none and no claim."""
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.delete(0)
    s.deliver_all()
    assert m.state_of(0)[:2] == ("soft-delete", None)
    assert not m.w.hosts[A].driver.running(), "a soft-deleted server's guest runs"
    s.deferred_delete(0, "restore")
    s.deferred_delete(0, "forceDelete")
    s.deliver_all()
    m.teardown()  # I0: a forceDelete accepted deletes; I1/I2: claims and copies agree


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_a_soft_deleted_server_is_reclaimed_past_its_interval(
    m: KeelMachine, reclaim_interval: float
) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.delete(0)
    s.deliver_all()
    s.advance(RECLAIM_INTERVAL + 1)
    s.sweep()
    s.deliver_all()
    assert m.state_of(0)[0] == "deleted"
    m.teardown()


def test_finding_27_an_old_agents_repeated_build_leaves_the_copy_a_twin_made(
    m: KeelMachine,
) -> None:
    """Finding 27 (the search, seed 4256826766): agents of a release before copy tokens; a
    build delivered three times to A. The first failed (the server went to ERROR, its
    claim released); the second made the guest and reported success; the third asked its
    build check, was told to abandon the build, and removed the guest the second had made
    — whose success then made the server ACTIVE with no guest. Such an agent cannot say
    which copy its guest is, so its check now leaves the guest for its own result."""
    s = Steps(m)
    s.upgrade_under_way(16)
    s.create(on=A)
    s.delete_service(A)
    s.duplicate(0)
    s.deliver(0, lose_ack=True)
    s.database_outage(count=3, who="scheduler")
    s.fail_next(A, "spawn")
    s.create(on=A)
    s.duplicate(4)
    s.delete_service(B)
    s.deliver_all()
    m.teardown()  # I3: the server's current copy is never removed; I2: it has one


def test_finding_28_a_build_cut_off_before_placement_gives_its_claim_back(
    m: KeelMachine,
) -> None:
    """Finding 28 (CI's search, seed 1056835176): the scheduler claimed a node for a new
    server and the conductor was killed before it recorded the placement; an admin reset
    the server to ERROR; the build, delivered again, found the server not building and
    skipped it — leaving the claim for ever (ERROR, no node, a claim). A build that finds
    its server reset and never placed now gives that claim back."""
    s = Steps(m)
    s.create()
    s.deliver(0, lose_ack=False, plan={"pause_at": 6})  # claimed, the placement not recorded
    assert m.state_of(0) == ("building", "scheduling", None)
    assert m.claimed_nodes(0)
    s.kill_control("conductor")
    for _ in range(5):
        s.deliver_oldest()
    s.reset_state(0, "error")
    m.teardown()  # I1: a server that was never placed holds no claim


def test_a_reset_during_a_builds_placement_leaves_the_claim_to_that_build(
    m: KeelMachine,
) -> None:
    """The same search: between the scheduler's claim and the recorded placement an admin
    reset the server to ERROR. The claim is the build's until it resumes, finds the server
    reset, and gives it back (per-step I1 allows it meanwhile; quiescence does not)."""
    s = Steps(m)
    s.create()
    s.deliver(0, lose_ack=False, plan={"pause_at": 6})  # claimed, the placement not recorded
    assert m.state_of(0) == ("building", "scheduling", None)
    assert m.claimed_nodes(0)
    s.reset_state(0, "error")
    m.teardown()


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_a_soft_deleted_servers_reclaim_that_could_not_be_sent_is_sent_again(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """CI's search (seed 1056835176): the reclaim's cast of a soft-deleted server failed
    (nothing sent); the next sweep sends it again. The model's settle stopped before that
    sweep and reported the server alive although its delete got 204; it now goes on
    while a soft-deleted server waits for its reclaim."""
    s = Steps(m)
    s.create()
    s.deliver_all()
    s.delete(0)
    s.deliver_all()
    s.cast_fails(delivered=False, which="conductor")
    assert ("delete", 204) in m.answers
    m.teardown()  # I0: a delete answered 204 ends with the server gone


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_29_a_reclaim_that_went_out_unconfirmed_is_withdrawn_before_its_agent_acts(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 29 (CI's search, seed 188418321, example 57): the reclaim of a soft-deleted
    server was cast to its agent, but the publish was not confirmed though it went out.
    The sweep cleared the delete's task to try again later, while the agent, taking the
    request all the same, destroyed the guest: the server's current copy, of a server the
    database showed soft-deleted (a restore would have brought it back without its disk).
    The sweep now withdraws the request first; the agent, finding it withdrawn, leaves the
    guest, and the next pass deletes the server."""
    s = Steps(m)
    s.create()
    s.deliver_all()
    s.cast_fails("conductor", delivered=True)
    s.delete(0)
    assert ("delete", 204) in m.answers
    m.teardown()  # I3: the current copy is destroyed only by the delete under way


def test_finding_30_a_live_migration_whose_task_was_reset_keeps_the_server_on_its_source(
    m: KeelMachine,
) -> None:
    """Finding 30 (the search, seed 2501789553, example 923): a live migration had its
    destination and had asked the source to copy the guest; the source's host crashed
    (the evacuation asked then was refused: the server was migrating) and an admin reset
    the server to active, which ends its task. When the source's agent came back it went
    on with the copy; the switch-over started the destination's copy but could not link
    the server to it (its task was no longer migrating) and completed the record all the
    same: the claim went to the destination while the server stayed on the source, and
    the source destroyed its guest — the server's current copy. The switch-over now fails
    the migration when the server's task was ended: the destination removes its copy and
    the source resumes the server's."""
    steps: list[Callable[[], None]] = [
        m.create,
        m.deliver_oldest,  # the build
        m.deliver_oldest,  # its result
        m.deliver_oldest,
        lambda: m.live_migrate(0),
        m.deliver_oldest,  # the conductor chooses the destination; the source is to copy
        lambda: m.evacuate_crashed(0),  # refused: the server is migrating
        m.deliver_oldest,
        lambda: m.reset_state(0, "active"),
    ]
    for step in steps:
        step()
        m.every_step()
    m.teardown()  # I1, I2, I3: the server keeps its copy and its claim on the source


@pytest.mark.parametrize("state", ["active", "error"])
def test_finding_31_a_revert_whose_task_was_reset_never_removes_the_servers_copy(
    m: KeelMachine, state: str
) -> None:
    """Finding 31 (found while fixing 30, by the same rule): a migration waited for its
    confirm; its revert was accepted, and an admin reset the server before the conductor
    took the revert. The conductor removed the destination's copy — the server still
    lived there — then could not link the server back to its source (its task was ended)
    and called the migration reverted: the server kept a record on the destination with
    no copy and its claim on the source. The revert now links the server back first; if
    its task was ended, the migration is in error, the server stays on the destination
    with its copy there current again and its claims there, and nothing is removed."""
    steps: list[Callable[[], None]] = [
        m.create,
        m.deliver_all,
        lambda: m.migrate(0),
        m.deliver_all,
        lambda: m.finish_resize(0, False),  # revert: accepted, its cast held
        lambda: m.reset_state(0, state),
        m.deliver_all,
    ]
    for step in steps:
        step()
        m.every_step()
    assert ("revertResize", 202) in m.answers
    m.teardown()  # I1, I2: the server keeps its copy and its claim where it lives


@pytest.mark.parametrize("state", ["active", "error"])
def test_finding_32_a_migration_whose_server_was_reset_is_confirmed_by_the_window(
    m: KeelMachine, state: str
) -> None:
    """Finding 32 (found beside 30 and 31): a migration waited for its confirm and an
    admin reset the server (no longer RESIZED): no one could confirm it any more, and it
    held both hosts' claims and copies for ever. The confirm window now confirms it all
    the same: the server lives on the destination."""
    steps: list[Callable[[], None]] = [
        m.create,
        m.deliver_all,
        lambda: m.migrate(0),
        m.deliver_all,
        lambda: m.reset_state(0, state),
        m.deliver_all,
    ]
    for step in steps:
        step()
        m.every_step()
    assert m.moves_of(0) == ["finished"]
    m.teardown()  # I4: settled once the window passed; I1, I2: one copy, one claim


@pytest.mark.parametrize("state", ["active", "error"])
def test_finding_33_a_reset_during_a_shelve_offload_is_refused(m: KeelMachine, state: str) -> None:
    """Finding 33 (found beside 30 and 31): the server was shelved and its offload asked
    for (its shelved image is now its current copy) when an admin reset it; the agent no
    longer took the offload (its task ended) and the server was ACTIVE or ERROR on a host
    whose guest was not its copy. A reset of a server offloaded or being offloaded is
    refused now (409): the offload goes on, and the server ends SHELVED_OFFLOADED."""
    steps: list[Callable[[], None]] = [
        m.create,
        m.deliver_all,
        lambda: m.shelve(0, "shelve"),
        m.deliver_oldest,  # the shelve: the image written
        m.deliver_oldest,  # its result: the offload asked for
        lambda: m.reset_state(0, state),
        m.deliver_all,
    ]
    for step in steps:
        step()
        m.every_step()
    assert m.answers[-1] == ("os-resetState", 409)
    assert m.state_of(0)[:2] == ("shelved_offloaded", None)
    m.teardown()  # I2: the server keeps a copy (its shelved image)


def test_finding_34_a_reset_while_a_delete_is_on_its_way_is_refused(m: KeelMachine) -> None:
    """Finding 34 (the search, seed 4072906765, example 420, shrunk): a delete was
    accepted and its terminate cast to the agent; an admin reset the server to active
    before the agent took it; the terminate named no task, so the agent destroyed the
    guest of a server the database showed ACTIVE. A reset of a server being deleted is
    refused now (409): the delete keel-api answered 204 goes on."""
    steps: list[Callable[[], None]] = [
        m.create,
        m.deliver_all,
        lambda: m.delete(0),
        lambda: m.reset_state(0, "active"),
        m.deliver_all,
    ]
    for step in steps:
        step()
        m.every_step()
    assert m.answers[-1] == ("os-resetState", 409)
    assert m.state_of(0)[0] == "deleted"
    m.teardown()  # I0: the delete answered 204 deleted the server; I3: nothing else lost


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
@pytest.mark.parametrize("state", ["active", "error"])
def test_finding_35_a_reset_of_a_soft_deleted_server_is_refused(
    m: KeelMachine, state: str, reclaim_interval: float
) -> None:
    """Finding 35 (found beside 34): with soft delete on, a DELETE answered 204 powered
    the guest off and kept the server; an admin's reset then brought it back ACTIVE with
    its guest off, and the delete answered 204 never happened. A reset of a soft-deleted
    server is refused now (409): a restore brings it back (its guest started), or the
    reclaim deletes it."""
    steps: list[Callable[[], None]] = [
        m.create,
        m.deliver_all,
        lambda: m.delete(0),
        m.deliver_all,
        lambda: m.reset_state(0, state),
    ]
    for step in steps:
        step()
        m.every_step()
    assert m.answers[-2:] == [("delete", 204), ("os-resetState", 409)]
    assert m.state_of(0)[:2] == ("soft-delete", None)
    m.teardown()  # I0: the delete answered 204 deleted the server once its reclaim came


@pytest.mark.parametrize("state", ["active", "error"])
def test_finding_31_a_revert_reset_after_its_server_was_linked_back_is_reverted(
    m: KeelMachine, state: str
) -> None:
    """Finding 31's other half: the revert linked the server back to its source, but the
    destination's agent was down and its copy still there; an admin then reset the
    server. When that agent came back and removed its copy, the revert's last step found
    the task ended: the migration is reverted, the server stays on its source with its
    claim there, its guest left as it is (the step does not start it)."""
    steps: list[Callable[[], None]] = [
        lambda: m.create(on=0),
        m.deliver_all,
        lambda: m.migrate(0, to=1),
        m.deliver_all,
        lambda: m.kill_agent(1),
        lambda: m.finish_resize(0, False),
        m.deliver_all,  # linked back; the destination's agent does not answer
        lambda: m.reset_state(0, state),
        lambda: m.start_agent(1),
        m.deliver_all,
    ]
    for step in steps:
        step()
        m.every_step()
    assert m.moves_of(0) == ["reverted"]
    assert m.state_of(0)[2] == "host0"
    m.teardown()  # I1: its claim on its source, none left on the destination


@pytest.mark.parametrize("delivered", [False, True])
def test_finding_36_a_delete_answered_for_an_older_agent_always_happens(
    m: KeelMachine, delivered: bool
) -> None:
    """Finding 36 (found by the search, seed 4230552597, once API requests could meet a
    broker that loses its confirms): A's agent is of the release before requests were
    taken; every attempt at a delete's cast fails, before the broker took the message or
    after. keel-api cannot withdraw a delete such an agent may act on, so it answers 204
    — and when the message never left, the task deadline cleared ``deleting`` and the
    server lived on. The conductor sends again a delete no agent took while its host's
    service is up."""
    s = Steps(m)
    m.restart_as(TAKING_REQUESTS_VERSION - 1)
    s.boot(on=A)
    s.delete(0, plan={"casts_fail": delivered})
    assert m.answers[-1] == ("delete", 204)
    m.teardown()  # I0: the server answered 204 is deleted


def test_finding_36_a_delete_answered_for_an_older_agent_happens_after_its_upgrade(
    m: KeelMachine,
) -> None:
    """Finding 36, its residue (seed 3140040429, flaky there through a cached RPC cap):
    the delete's message never left, then A crashed; it came back with its agent
    upgraded (it takes requests now). The task deadline cleared ``deleting`` once A's
    service spoke the newer release, and nothing sent the delete again. A delete no agent
    took is never cleared by the task deadline, and is sent again whatever the agent's
    release."""
    s = Steps(m)
    m.restart_as(TAKING_REQUESTS_VERSION - 1)
    s.boot(on=A)
    s.delete(0, plan={"casts_fail": False})
    assert m.answers[-1] == ("delete", 204)
    s.crash(A, force_down=True)
    m.teardown()  # I0: the server answered 204 is deleted


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_36_a_force_delete_answered_for_an_older_agent_always_happens(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 36 with soft delete on (seed 1515279842): a forceDelete of a server on an
    older agent, its every cast lost before the broker took it, answered 202."""
    s = Steps(m)
    m.restart_as(TAKING_REQUESTS_VERSION - 1)
    s.boot(on=A)
    s.deferred_delete(0, "forceDelete", plan={"casts_fail": False})
    assert m.answers[-1] == ("forceDelete", 202)
    m.teardown()  # I0: the server answered 202 is deleted


def test_finding_37_a_delete_withdrawn_leaves_an_earlier_deletes_task(m: KeelMachine) -> None:
    """Finding 37 (found by the search, seed 3693425815): a delete answered 204, its
    terminate on its way; a second delete of the server, every cast of it lost, was
    withdrawn (503) — and its withdrawal cleared the ``deleting`` task the first had set.
    The first's terminate then destroyed the guest of a server shown ACTIVE. A withdrawn
    delete leaves a task it found as it found it."""
    s = Steps(m)
    s.boot(on=A)
    s.delete(0)
    s.delete(0, plan={"casts_fail": False})
    assert m.answers[-2:] == [("delete", 204), ("delete", 503)]
    assert m.state_of(0)[:2] == ("active", "deleting")
    s.deliver_all()
    m.teardown()  # I3: no current copy destroyed; I0: the delete answered 204 happened


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


def test_finding_39_a_delete_withdrawn_leaves_the_mark_of_one_sent_beside_it(
    m: KeelMachine,
) -> None:
    """Finding 39 (found by the search, seed 3521208881, example 930): two deletes of a
    server being live-migrated, both begun from that state; the first, every cast of it
    lost, was withdrawn (503) and put back the task it had found (``migrating``) over the
    ``deleting`` mark the second — sent, 204 — had written. The second's terminate then
    destroyed the guest of a server shown migrating. A withdrawn delete leaves the mark
    of another delete under way."""
    s = Steps(m)
    s.boot()
    s.delete(0, plan={"pause_at": 1})
    s.delete(0, plan={"pause_at": 1})
    s.live_migrate(0, force=False, plan={}, to=None)
    s.cast_fails("api", delivered=False, times=3)
    s.deliver_all()
    assert sorted(a for a in m.answers if a[0] == "delete") == [("delete", 204), ("delete", 503)]
    m.teardown()  # I3: no current copy destroyed; I0: the delete answered 204 happened


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_40_a_reset_of_a_server_being_soft_deleted_is_refused(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 40 (found by the search, seed 3280377776, example 2,053): with soft delete
    on, a DELETE answered 204 sent its soft delete; an admin's reset while it was on its
    way cleared ``soft-deleting``, the agent's soft delete then acted on nothing, and the
    server lived on. Finding 34's refusal, for a soft delete: 409."""
    s = Steps(m)
    s.boot()
    s.delete(0)
    s.deliver_oldest()
    s.reset_state(0, "active")
    assert m.answers[-2:] == [("delete", 204), ("os-resetState", 409)]
    m.teardown()  # I0: the delete answered 204 deleted the server once its reclaim came


def test_finding_41_a_server_whose_rebuild_failed_is_not_reset_to_active(
    m: KeelMachine,
) -> None:
    """Finding 41 (found by the search, seed 1221867230, example 987): a rebuild whose
    spawn failed left the server in ERROR with its old guest destroyed and no new one;
    an admin's reset made it ACTIVE with no copy anywhere. Refused now (409: rebuild it
    again, or delete it); the rebuild again brings it back."""
    s = Steps(m)
    s.boot(on=A)
    s.fail_next(A, "spawn")
    s.rebuild(0)
    s.deliver_all()
    assert m.state_of(0)[0] == "error"
    s.reset_state(0, "active")
    assert m.answers[-1] == ("os-resetState", 409)
    s.rebuild(0)
    s.deliver_all()
    assert m.state_of(0)[:2] == ("active", None)
    m.teardown()  # I2: a live server has exactly one copy


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


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_43_a_force_delete_withdrawn_gives_a_soft_delete_its_mark_back(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 43 (found by the search, seed 2251706724, example 1,864), finding 39's
    fix too wide: with soft delete on, a DELETE answered 204 cast its soft delete; a
    force-delete, every cast of it lost, was withdrawn and left its own ``deleting`` in
    place because the soft delete is recorded as a delete too. The soft delete then
    found no ``soft-deleting`` to act on, and the server answered 204 lived on. The
    withdrawal puts the soft delete's mark back."""
    s = Steps(m)
    s.boot()
    s.delete(0)
    s.deferred_delete(0, "forceDelete", plan={"casts_fail": False})
    assert m.answers[-2:] == [("delete", 204), ("forceDelete", 503)]
    assert m.state_of(0)[:2] == ("active", "soft-deleting")
    m.teardown()  # I0: the delete answered 204 deleted the server once its reclaim came


def test_finding_44_a_build_that_ends_while_a_delete_is_on_its_way_is_recorded(
    m: KeelMachine,
) -> None:
    """Finding 44 (found by the search, seed 2903922881, example 150): a delete of a
    server still building marked it ``deleting``; its guest built, the agent's result
    reached the conductor, which dropped it (a server being deleted has no copy to
    keep). The delete, every cast of it lost, was withdrawn and gave the server its
    ``spawning`` back; no result came again, and the build deadline put the server in
    ERROR and released its claim while its guest ran. The result is now recorded under
    the mark, and the withdrawal leaves the server ACTIVE."""
    s = Steps(m)
    s.create()
    s.deliver_oldest()  # the conductor places it and casts its build
    assert s.deliver_named("build_and_run_instance", B, pause_at=3)  # built, checked
    s.delete(0, plan={"casts_fail": False, "pause_at": 8})  # marked, its casts to come
    s.resume(0)  # the build's result goes out
    assert s.deliver_named("instance_build_result")
    assert m.state_of(0) == ("active", "deleting", "host1")
    s.resume(0)  # every cast of the delete fails: withdrawn
    assert m.answers[-1] == ("delete", 503)
    assert m.state_of(0) == ("active", None, "host1")
    m.teardown()  # I1: the guest that runs is claimed
