"""Every step of the move workflows cut or paused in turn (the functional tier runs it).

Systematic where the search samples: for each handler of a move's life (the move task,
the destination's rebuild, the move's result, confirm and revert, a guest report, a
delete), its process is killed at each of its first steps — or it is paused there while
a racing operation runs — then everything is delivered and the cloud settled, with every
invariant checked. About 120 cases, two minutes, in the functional tier (and again after
``make test-model``'s long search).
"""

from __future__ import annotations

import pytest

from tests.model.machine import KeelMachine
from tests.model.script import A, B, Steps

pytestmark = pytest.mark.functional

KS = range(1, 9)


def _migrated(s: Steps) -> None:
    s.create(on=A)
    s.deliver_all()
    s.migrate(0, to=B)


@pytest.mark.parametrize("k", KS)
def test_kill_conductor_in_migrate(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    _migrated(s)
    s.deliver_named("migrate_instance", kill_at=k)
    s.start_control("conductor")
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
def test_kill_conductor_in_move_result(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    _migrated(s)
    s.deliver_named("migrate_instance")
    s.deliver_named("rebuild_instance", B)
    s.deliver_named("move_result", kill_at=k)
    s.start_control("conductor")
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("confirm", [True, False])
def test_kill_conductor_in_confirm_or_revert(m: KeelMachine, k: int, confirm: bool) -> None:
    s = Steps(m)
    _migrated(s)
    s.deliver_all()
    s.finish_resize(0, confirm=confirm)
    s.deliver_named("confirm_migration" if confirm else "revert_migration", kill_at=k)
    s.start_control("conductor")
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
def test_kill_conductor_in_evacuation_result(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    s.deliver_named("evacuate_instance")
    s.deliver_named("rebuild_instance", B)
    s.deliver_named("move_result", kill_at=k)
    s.start_control("conductor")
    s.deliver_all()
    s.bring_back(A)
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
def test_kill_agent_in_guest_report_after_evacuation(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    s.deliver_all()
    s.start_agent(A)
    s.guest_report(A, plan={"kill_at": k})
    s.start_agent(A)
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
def test_kill_api_in_delete_during_move(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    _migrated(s)
    s.deliver_named("migrate_instance")
    s.delete(0, plan={"kill_at": k})
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
def test_kill_agent_in_rebuild(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    _migrated(s)
    s.deliver_named("migrate_instance")
    s.deliver_named("rebuild_instance", B, kill_at=k)
    s.start_agent(B)
    s.deliver_all()
    m.teardown()


def _to_result(s: Steps, evacuate: bool) -> None:
    s.create(on=A)
    s.deliver_all()
    if evacuate:
        s.crash(A, force_down=True)
        s.evacuate(0, to=B)
        s.deliver_named("evacuate_instance")
    else:
        s.migrate(0, to=B)
        s.deliver_named("migrate_instance")
    s.deliver_named("rebuild_instance", B)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("evacuate", [True, False])
def test_delete_paused_then_result(m: KeelMachine, k: int, evacuate: bool) -> None:
    s = Steps(m)
    _to_result(s, evacuate)
    s.delete(0, plan={"pause_at": k})
    s.deliver_named("move_result")
    s.resume(0)
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("evacuate", [True, False])
def test_result_paused_then_delete(m: KeelMachine, k: int, evacuate: bool) -> None:
    s = Steps(m)
    _to_result(s, evacuate)
    s.deliver_named("move_result", pause_at=k)
    s.delete(0)
    s.resume(0)
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("evacuate", [True, False])
def test_result_paused_then_deadline(m: KeelMachine, k: int, evacuate: bool) -> None:
    s = Steps(m)
    _to_result(s, evacuate)
    s.deliver_named("move_result", pause_at=k)
    s.advance(3601.0)
    s.sweep()
    s.resume(0)
    s.resume(0)
    s.deliver_all()
    m.teardown()


@pytest.mark.parametrize("k", KS)
def test_guest_report_paused_then_evacuation_result(m: KeelMachine, k: int) -> None:
    s = Steps(m)
    s.create(on=A)
    s.deliver_all()
    s.crash(A, force_down=True)
    s.evacuate(0, to=B)
    s.deliver_all()
    s.start_agent(A)
    s.force_down(A, down=False)
    s.crash(B, force_down=True)
    s.evacuate(0, to=A)
    s.deliver_named("evacuate_instance")
    s.guest_report(A, plan={"pause_at": k})
    s.deliver_named("rebuild_instance", A)
    s.deliver_named("move_result")
    s.resume(0)
    s.deliver_all()
    m.teardown()
