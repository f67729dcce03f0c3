"""The model's findings about builds, as explicit examples: repeated deliveries, failed
spawns, build deadlines, creates withdrawn or cut off, results that meet a delete.

Written as ``test_findings.py`` (see its docstring).
"""

from __future__ import annotations

import logging

import pytest

from shared.versions import HOST_FENCE_VERSION
from tests.model import known
from tests.model.machine import KeelMachine
from tests.model.script import A, B, C, Steps

pytestmark = pytest.mark.functional


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


@pytest.mark.parametrize("action", ["os-stop", "hard"])
def test_finding_48_a_server_whose_build_failed_is_not_powered_before_its_late_result(
    m: KeelMachine, action: str
) -> None:
    """Finding 48 (found by the search's redelivered boots, seed 407771703, example 143,
    on a worktree with finding 16's fix taken out; it holds on main): a build reached A
    twice; the first spawn failed and its result, arriving first, put the server in
    ERROR and released its claim; the second ran the guest, its result still on its way.
    A stop (allowed from ERROR) powered the guest off: the server was SHUTOFF, and the
    late result, finding it no longer in ERROR, claimed nothing: a guest on resources
    nobody had claimed. keel-api refuses to power a server in ERROR that holds no claim
    on its node (409); the late result makes it ACTIVE, claimed."""
    s = Steps(m)
    s.boot_delivered_again(on=A, copies=2, failing=True, after=2, results=1)
    assert m.state_of(0) == ("error", None, "host0")
    s.power(0, action)
    assert m.answers[-1] == (action, 409)
    m.teardown()  # I1: the guest that runs is claimed
    assert m.state_of(0) == ("active", None, "host0")


def test_finding_52_a_late_scheduling_claims_nothing_for_a_deleted_server(
    m: KeelMachine,
) -> None:
    """Finding 52 (found by the search, seed 376807182, example 324): the conductor's
    scheduling call for a new server waited in the scheduler's queue; an admin reset the
    server to ERROR and deleted it (never placed: deleted at once, nothing to release);
    the conductor died, and the call, delivered at last, claimed a node for the deleted
    server, a claim nothing would ever release (I1). The scheduler holds the server's
    row while it claims and claims nothing for a deleted server."""
    s = Steps(m)
    s.call_disturbed(fault="held", h=0, who="conductor")
    s.boot_delivered_again(after=2, copies=1, failing=False, on=None, results=2)
    assert m.state_of(0) == ("building", "scheduling", None)
    s.reset_state(0, "error")
    s.delete(0)
    assert m.answers[-1] == ("delete", 204)
    s.kill_control("conductor")
    s.deliver_oldest()  # the scheduling call
    m.teardown()  # I1: no claim held by a deleted server


def test_finding_54_an_evacuated_server_whose_build_came_twice_and_failed(
    m: KeelMachine,
) -> None:
    """Finding 54 (found by the search, seed 3144606169, example 4,619): a build
    delivered twice to its agent, the first spawn failing (ERROR, claim released), the
    second's success not delivered yet; the conductor killed in a sweep; the server
    evacuated, the evacuation finding no host. The success arrived under the evacuation
    and was ignored, so the server (ERROR) kept a copy on its node with no claim there
    (I1). Such a success now records the claim again, the server's state left to its
    task (``instance_events._built_under_another_task``)."""
    s = Steps(m)
    s.boot_delivered_again(on=None, copies=2, failing=True, after=1, results=0)
    s.deliver_oldest()
    s.sweep(plan={"kill_at": 1})
    s.evacuate_crashed(0, to=None)
    m.teardown()
