"""The model's findings about an admin's state reset (``os-resetState``), as explicit
examples: resets during builds, moves, deletes, soft deletes, shelves and failed
rebuilds.

Written as ``test_findings.py`` (see its docstring).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.model.machine import KeelMachine
from tests.model.script import A, Steps
from tests.model.world import RECLAIM_INTERVAL

pytestmark = pytest.mark.functional


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
