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


def test_soft_delete_restore_and_their_ends_are_in_the_table() -> None:
    for old, new in [
        (("active", None), ("active", "soft-deleting")),
        (("stopped", None), ("stopped", "soft-deleting")),
        (("active", "soft-deleting"), ("soft-delete", None)),
        (("stopped", "soft-deleting"), ("soft-delete", None)),
        (("active", "soft-deleting"), ("active", None)),  # failed, withdrawn, timed out
        (("soft-delete", None), ("soft-delete", "restoring")),
        (("soft-delete", "restoring"), ("active", None)),
        (("soft-delete", "restoring"), ("soft-delete", None)),
        (("soft-delete", None), ("soft-delete", "deleting")),  # forceDelete, the reclaim
        (("soft-delete", "deleting"), ("deleted", None)),
        (("soft-delete", "deleting"), ("soft-delete", None)),  # a delete withdrawn
    ]:
        assert transitions.instance_allowed(old, new), (old, new)


def test_soft_delete_never_skips_its_agent() -> None:
    """Only the agent's result makes a server soft-deleted or active again: no swap of
    the vm state alone, and no soft delete of what powering off would not leave off."""
    for old, new in [
        (("active", None), ("soft-delete", None)),
        (("soft-delete", None), ("active", None)),
        (("soft-delete", None), ("stopped", None)),
        (("paused", None), ("paused", "soft-deleting")),
        (("suspended", None), ("suspended", "soft-deleting")),
        (("error", None), ("error", "soft-deleting")),
        (("active", None), ("active", "restoring")),
        (("stopped", "soft-deleting"), ("active", None)),
        (("soft-delete", "restoring"), ("stopped", None)),
    ]:
        assert not transitions.instance_allowed(old, new), (old, new)


def test_every_power_action_keel_api_begins_is_in_the_table() -> None:
    """What begin_task is asked for each action: a gap here is a 500 (finding 20)."""
    from services.api.servers import power, soft_delete  # noqa: PLC0415

    actions = [
        v
        for module in (power, soft_delete)
        for v in vars(module).values()
        if isinstance(v, power.PowerAction)
    ]
    assert len(actions) >= 10
    for action in actions:
        transitions.require_begin(
            tuple(vm.value for vm in action.vm_states),
            tuple(None if t is None else t.value for t in action.from_tasks),
            action.task.value,
        )
