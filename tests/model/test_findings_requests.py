"""The model's findings about what keel-api answers, as explicit examples: deletes, stops
and soft deletes whose casts may have gone or not (202/204 means it happens, 503 that
nothing does), withdrawals, older agents, outages.

Written as ``test_findings.py`` (see its docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.versions import TAKING_REQUESTS_VERSION
from tests.model import known
from tests.model.machine import KeelMachine
from tests.model.script import A, Steps
from tests.model.world import DOWN_TIME, RECLAIM_INTERVAL

pytestmark = pytest.mark.functional

#: Every attempt fails before the message leaves, or after it went out unconfirmed.
UNSENT_OR_SENT = [False, True]


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


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_45_a_soft_delete_whose_agent_was_down_past_the_timeout_happens(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 45 (found reading the task deadline beside finding 36's fix, then shown
    by this example): with soft delete on, a DELETE answered 204 cast its soft delete to
    an agent that was down; past ``KEEL_TASK_TIMEOUT`` the task deadline cleared
    ``soft-deleting``, and the agent, back, found its request ended and did nothing: the
    server answered 204 ran on. A soft delete no agent took is now a delete no agent
    took: never cleared while its host's service exists, sent again while it is up."""
    s = Steps(m)
    s.boot(on=A)
    s.kill_agent(A)
    s.delete(0)
    assert m.answers[-1] == ("delete", 204)
    s.advance(3601.0)
    s.sweep()
    assert m.state_of(0) == ("active", "soft-deleting", "host0")
    m.teardown()  # I0: the delete answered 204 deleted the server once its reclaim came


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_46_a_soft_delete_whose_agent_died_at_it_happens_when_it_is_back(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 46 (finding 45's sibling, found the same way): the agent took the soft
    delete and died at it; past ``KEEL_TASK_TIMEOUT`` the task deadline cleared
    ``soft-deleting``. Back, the agent was given the message again and powered the guest
    off, but its result found no task to end: the server answered 204 ran on, ACTIVE.
    The task deadline leaves a soft delete an agent took and did not finish while its
    host's service exists."""
    s = Steps(m)
    s.boot(on=A)
    s.delete(0)
    assert m.answers[-1] == ("delete", 204)
    assert s.deliver_named("soft_delete_instance", A, kill_at=2)  # taken; the agent dies
    s.advance(3601.0)
    s.sweep()
    assert m.state_of(0) == ("active", "soft-deleting", "host0")
    m.teardown()  # I0: soft-deleted once its agent was back, reclaimed at its interval


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
@pytest.mark.parametrize("taken", [False, True])
def test_finding_47_a_restore_answered_202_is_never_reclaimed(
    m: KeelMachine, reclaim_interval: float, taken: bool
) -> None:
    """Finding 47 (findings 45 and 46's sibling, found the same way): a soft-deleted
    server's restore was answered 202 while its agent was down (or the agent took it and
    died at it); past ``KEEL_TASK_TIMEOUT`` the task deadline cleared ``restoring`` and,
    in the same sweep, the soft-delete reclaim deleted for good the server its user had
    asked back. The task deadline leaves a restore keel-api did not withdraw and nothing
    ended while its host's service exists: the agent, back, restores the server."""
    s = Steps(m)
    s.boot(on=A)
    s.delete(0)
    s.deliver_all()
    assert m.state_of(0) == ("soft-delete", None, "host0")
    if not taken:
        s.kill_agent(A)
    s.deferred_delete(0, "restore")
    assert m.answers[-1] == ("restore", 202)
    if taken:
        assert s.deliver_named("restore_instance", A, kill_at=2)  # taken; the agent dies
    s.advance(3601.0)
    s.sweep()
    assert m.state_of(0) == ("soft-delete", "restoring", "host0")
    m.teardown()  # every process back, every message delivered, every deadline passed
    assert m.state_of(0) == ("active", None, "host0")


@pytest.mark.parametrize("outage", [3, 4])
def test_finding_49_a_delete_keel_api_cannot_withdraw_for_an_outage_is_not_503(
    m: KeelMachine, outage: int
) -> None:
    """Finding 49 (found by the search, seed 3158324986, example 1,646; reported flaky by
    Hypothesis, replayed here every time): a delete marked its server ``deleting`` and
    recorded itself; then keel-api's database went away. Its client could not read the
    services' versions to send it, and the withdrawal could not reach the database
    either: keel-api answered 503, but the delete stood, and the conductors, finding it
    untaken, sent it again: the server answered 503 was deleted. Now a request keel-api
    cannot withdraw is answered as sent (204 here), and it happens; one it withdrew,
    the database back in time (an outage of three connections), is a 503 that deletes
    nothing."""
    s = Steps(m)
    s.boot()
    s.delete(0, plan={"casts_fail": True, "pause_at": 1})
    while m.state_of(0)[1] != "deleting":  # step by step until the delete is recorded
        (request,) = m.rt.paused()
        m.act(m._start(lambda a=request: m.rt.resume(a, step=True)))
    s.database_outage(who="api", count=outage)
    s.resume(0)
    assert m.answers[-1] == ("delete", 204 if outage == 4 else 503)
    m.teardown()  # I0: 204, the server is deleted; 503, it lives


def test_finding_50_a_withdrawn_delete_gives_back_the_task_it_replaced(m: KeelMachine) -> None:
    """Finding 50 (found by the search, seed 1438599163, example 10,088): a delete read its
    server during a resize (``resize_prep``) and paused; the resize went on
    (``resize_migrating``, the destination building); the delete then marked the server
    ``deleting``, every cast of it failed, and its withdrawal gave back the task it had
    read, not the one it replaced: ``resize_prep``, which nothing ever ends, while the
    resize, finding its task gone, stopped in ``error``. The mark now returns the task it
    replaced, and the withdrawal gives that back: the resize goes on."""
    s = Steps(m)
    s.boot()
    s.resize(0, "model.big")
    s.delete(0, plan={"pause_at": 3})  # read the server in resize_prep; paused
    s.rebuild(0, plan={"casts_fail": False})  # 409, its casts' faults linger
    s.deliver_oldest()  # the resize goes on: resize_migrating
    s.deliver_oldest()
    assert m.state_of(0)[1] == "resize_migrating"
    s.resume(0)  # the delete marks, fails to send, is withdrawn
    assert m.answers[-1] == ("delete", 503)
    assert m.state_of(0)[1] == "resize_migrating"
    m.teardown()  # I4: no task left, no move unended


def _step_until(m: KeelMachine, action: str, task: str) -> None:
    """Step the paused request ``action`` until the server's task is ``task``."""
    while m.state_of(0)[1] != task:
        (request,) = [a for a in m.rt.paused() if action in a.what]
        m.act(m._start(lambda a=request: m.rt.resume(a, step=True)))


def test_finding_51_a_withdrawn_delete_gives_no_task_back_to_a_move_gone_meanwhile(
    m: KeelMachine,
) -> None:
    """Finding 51 (found by the search, seed 1299267639, example 1,210): a migration
    marked its server ``resize_prep``; a force-delete, paused, marked it ``deleting``.
    Every cast of the migration failed, and it was withdrawn (its record ended, its task
    left under the delete's mark); then every cast of the force-delete failed, and its
    withdrawal gave back ``resize_prep``: a task of a move no one would make, never
    ended. A withdrawn delete now gives a task back only while the request that began it
    is still open."""
    s = Steps(m)
    s.boot()
    s.migrate(0, plan={"casts_fail": False, "pause_at": 1})
    _step_until(m, "migrate", "resize_prep")
    s.deferred_delete(0, "forceDelete", plan={"casts_fail": False, "pause_at": 1})
    _step_until(m, "forceDelete", "deleting")
    (migrate,) = [a for a in m.rt.paused() if "migrate" in a.what]
    m.act(m._start(lambda: m.rt.resume(migrate, step=False)))
    assert m.answers[-1] == ("migrate", 503)
    s.resume(0)
    assert m.answers[-1] == ("forceDelete", 503)
    assert m.state_of(0)[:2] == ("active", None)
    m.teardown()  # I4: no task left that nothing will end


#: Requests whose task a delete's mark may replace: the rule that sends each, its task.
UNDER_A_MARK: dict[str, tuple[Callable[[Steps, dict[str, Any]], None], str]] = {
    "os-stop": (lambda s, plan: s.power(0, "os-stop", plan=plan), "powering-off"),
    "snapshot": (lambda s, plan: s.snapshot(0, plan=plan), "image_snapshot"),
    "shelve": (lambda s, plan: s.shelve(0, "shelve", plan=plan), "shelving"),
    "rebuild": (lambda s, plan: s.rebuild(0, plan=plan), "rebuild_spawning"),
}


@pytest.mark.parametrize("request_name", list(UNDER_A_MARK))
def test_finding_53_a_request_unsent_under_a_deletes_mark_is_503(
    m: KeelMachine, request_name: str
) -> None:
    """Finding 53 (found reading beside finding 51): a stop (a snapshot, a shelve, a
    rebuild) marked its server with its task; a force-delete, paused, marked it
    ``deleting``; every cast of the request failed, and its withdrawal, finding its task
    gone, took the request for taken: 202, though nothing was sent. It is 503 now, the
    request withdrawn and undone but for the mark (no image left unfinished, the rebuild's
    image back); and the force-delete, its casts failing too, gives it no task back."""
    send, task = UNDER_A_MARK[request_name]
    s = Steps(m)
    s.boot()
    before = m.run(_image_and_unfinished(m))
    send(s, {"casts_fail": False, "pause_at": 1})
    _step_until(m, request_name, task)
    s.deferred_delete(0, "forceDelete", plan={"casts_fail": False, "pause_at": 1})
    _step_until(m, "forceDelete", "deleting")
    (paused,) = [a for a in m.rt.paused() if request_name in a.what]
    m.act(m._start(lambda: m.rt.resume(paused, step=False)))
    assert m.answers[-1] == (request_name, 503)
    s.resume(0)
    assert m.answers[-1] == ("forceDelete", 503)
    assert m.state_of(0)[:2] == ("active", None)
    assert m.run(_image_and_unfinished(m)) == before
    m.teardown()


async def _image_and_unfinished(m: KeelMachine) -> tuple[str, int]:
    """The first server's image, and how many images are still being made."""
    async with m.w.db.acquire() as conn:
        image = await conn.fetchval("SELECT image_ref FROM instances WHERE uuid = $1", m.server(0))
        unfinished = await conn.fetchval(
            "SELECT count(*) FROM images WHERE status IN ('queued', 'saving')"
        )
    return image, unfinished


@pytest.mark.parametrize("reclaim_interval", [RECLAIM_INTERVAL])
def test_finding_55_faults_armed_at_quiescence_end_after_its_first_round(
    m: KeelMachine, reclaim_interval: float
) -> None:
    """Finding 55 (found by the search, seed 2718281828, example 1,553; the model's): with
    soft delete on, a server deleted (204) while six of the conductor's casts are armed to
    fail. None fails during the steps; at quiescence the reclaim's sweep, the conductor's
    only cast, met one armed fault a round, and six rounds went by with the server still
    soft-deleted (I4, and I0: a delete answered 204 that never happened). keel handed each
    reclaim back for the next pass, as it should; the model now disarms what is still
    armed after the first round, and the server is reclaimed."""
    s = Steps(m)
    s.cast_fails("api", delivered=False, times=1)
    s.boot()
    s.delete(0, plan={"casts_fail": False})
    s.interleave(k=0, j=None, order=[])
    s.cast_fails("conductor", delivered=False, times=3)
    s.cast_fails("api", delivered=False, times=1)
    s.cast_fails("api", delivered=True, times=1)
    s.guest_report(A)
    s.force_down(A, down=False)
    s.guest_report(A)
    s.delete(0)
    s.cast_fails("conductor", delivered=False, times=3)
    s.interleave(k=0, j=None, order=[])
    m.teardown()
