"""The state table in production: what the writers of states may be asked to write."""

from __future__ import annotations

import pytest

from shared.objects import transitions


def test_a_transition_in_the_table_passes_and_one_outside_it_is_refused() -> None:
    transitions.require(("active", None), ("active", "powering-off"))
    with pytest.raises(transitions.InvalidTransition, match="may not go"):
        transitions.require(("stopped", None), ("stopped", "pausing"))


def test_a_task_swap_needs_one_vm_state_that_allows_it() -> None:
    """A hard reboot replaces a soft one (which only an ACTIVE server has)."""
    transitions.require_task_change(
        "rebooting", "rebooting_hard", vm_states=("active", "stopped", "error")
    )
    with pytest.raises(transitions.InvalidTransition):
        transitions.require_task_change("rebooting", "rebooting_hard", vm_states=("stopped",))


def test_pause_suspend_and_their_ends_are_in_the_table() -> None:
    for old, new in [
        (("active", None), ("active", "pausing")),
        (("active", "pausing"), ("paused", None)),
        (("paused", "unpausing"), ("active", None)),
        (("suspended", "resuming"), ("active", None)),
    ]:
        assert transitions.instance_allowed(old, new), (old, new)


def test_every_power_action_keel_api_begins_is_in_the_table() -> None:
    """What begin_task is asked for each action: a gap here is a 500 (finding 20)."""
    from services.api.servers import power  # noqa: PLC0415

    actions = [v for v in vars(power).values() if isinstance(v, power.PowerAction)]
    assert len(actions) >= 8
    for action in actions:
        transitions.require_begin(
            tuple(vm.value for vm in action.vm_states),
            tuple(None if t is None else t.value for t in action.from_tasks),
            action.task.value,
        )
