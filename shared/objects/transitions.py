"""The state table, as data: which transitions an instance or a move may make.

The one copy: the functions of ``shared/db/instances.py`` that write an instance's
state check what they are asked to write against it (:func:`require`: a transition not
in the table is a bug, raised before anything is written), and the model-based test's
invariant I5 checks every committed transition the database triggers recorded against
it (``tests/model/invariants.py``). A transition missing here is either a bug in keel or
a gap in this table: decide which from the code and the guide (docs/) before adding a row, and
say why in the row's comment.

An instance state is ``(vm_state, task_state)``; ``None`` before it exists. A change of
the instance's node is allowed only by the transitions in :data:`NODE_CHANGES`.
"""

from __future__ import annotations

State = tuple[str | None, str | None]

CREATED: State = (None, None)
DELETED: State = ("deleted", None)
#: What an admin may reset a server to (os-resetState), from any state.
RESET: frozenset[State] = frozenset({("active", None), ("error", None)})

#: Power actions: (task, vm_states it starts from, vm_state after success).
_POWER = {
    "powering-off": (("active", "error"), "stopped"),
    "powering-on": (("stopped",), "active"),
    "rebooting": (("active",), "active"),
    # A hard reboot starts a paused or suspended server afresh too (power.py).
    "rebooting_hard": (("active", "stopped", "error", "paused", "suspended"), "active"),
}


#: The vm states a DELETE soft-deletes (with no task under way): a server whose guest was
#: built and is running or shut off, so powering it off leaves it plainly off. Any other
#: (building, ERROR, VERIFY_RESIZE, paused, suspended, or with a task) is deleted at once,
#: as Nova deletes a server it cannot soft-delete.
SOFT_DELETABLE = ("active", "stopped")

#: The vm states a snapshot (``createImage``) starts from, with no task, as in Nova.
SNAPSHOTTABLE = ("active", "stopped", "paused", "suspended")

#: The vm states a shelve starts from, with no task, as in Nova: a snapshot's.
SHELVABLE = SNAPSHOTTABLE


def _instance_transitions() -> set[tuple[State, State]]:
    allowed: set[tuple[State, State]] = set()

    def add(old: State, *new: State) -> None:
        allowed.update((old, n) for n in new)

    # A create: building, then scheduled, then built, failed, or past its deadline.
    add(CREATED, ("building", "scheduling"))
    add(("building", "scheduling"), ("building", "spawning"), ("error", None))
    add(("building", "spawning"), ("active", None), ("error", None))
    # A build whose success arrives after the build deadline put it in ERROR: the guest
    # runs, so the server is ACTIVE again, its claim recorded (instance_events.py).
    add(("error", None), ("active", None))
    # Pause, unpause, suspend and resume: as the power actions above (services/api/servers/
    # power.py and the agent's result, conductor instance_events.py).
    for vm, task, success in (
        ("active", "pausing", "paused"),
        ("paused", "unpausing", "active"),
        ("active", "suspending", "suspended"),
        ("paused", "suspending", "suspended"),
        ("suspended", "resuming", "active"),
    ):
        add((vm, None), (vm, task))
        add((vm, task), (success, None), (vm, None))
    # Soft delete (KEEL_RECLAIM_INSTANCE_INTERVAL > 0): a DELETE of a server with no task
    # powers its guest off and keeps it, claims and all, in SOFT_DELETED; a failure, a
    # withdrawal or the task deadline leaves it as it was (services/api/servers/
    # soft_delete.py, the agent's result in conductor instance_events.py).
    for vm in SOFT_DELETABLE:
        add((vm, None), (vm, "soft-deleting"))
        add((vm, "soft-deleting"), ("soft-delete", None), (vm, None))
    # Restore of a soft-deleted server: its guest is powered on and it is ACTIVE again; a
    # failure, a withdrawal or the task deadline leaves it soft-deleted. (Force delete and
    # the reclaim sweep are deletes: the rules below instance_allowed's table cover them.)
    add(("soft-delete", None), ("soft-delete", "restoring"))
    add(("soft-delete", "restoring"), ("active", None), ("soft-delete", None))
    for task, (starts, success) in _POWER.items():
        for vm in starts:
            # Started by keel-api; ended by the agent's result (success or failure), or
            # withdrawn by keel-api when the message could not be sent.
            add((vm, None), (vm, task))
            add((vm, task), (success, None), (vm, None))
    # A server's recorded power state follows what its host reports when no task is under
    # way (docs/repair.md, "Every state has a deadline": a guest that stopped by itself — its
    # host crashed, or fenced itself while cut off — or a stop or start whose task was
    # cleared; services/conductor/guests/verdicts.py _follow_power).
    add(("active", None), ("stopped", None))
    add(("stopped", None), ("active", None))
    # A hard reboot may replace a soft one in progress (Nova's rule).
    for vm in ("active",):
        add((vm, "rebooting"), (vm, "rebooting_hard"))
    # Evacuation: from ACTIVE, SHUTOFF or ERROR; done (as it was, on the destination),
    # failed or no valid host (ERROR), withdrawn (as it was).
    for vm in ("active", "stopped", "error"):
        add((vm, None), (vm, "rebuilding"))
        add((vm, "rebuilding"), ("active" if vm != "stopped" else "stopped", None))
        add((vm, "rebuilding"), ("error", None), (vm, None))
    # Rebuild (services/api/servers/rebuild.py): from ACTIVE, SHUTOFF or ERROR; done
    # (SHUTOFF stays SHUTOFF, as in Nova; else ACTIVE), failed or past the task deadline
    # (ERROR: the old guest is gone, the new one may not exist), or withdrawn by keel-api
    # (as it was).
    for vm in ("active", "stopped", "error"):
        add((vm, None), (vm, "rebuild_spawning"))
        add((vm, "rebuild_spawning"), ("stopped" if vm == "stopped" else "active", None))
        add((vm, "rebuild_spawning"), ("error", None), (vm, None))
    # Snapshot (services/api/servers/snapshot.py): the vm state never changes; the task
    # goes image_snapshot → image_pending_upload → image_uploading (keel-api, as the
    # agent's upload arrives) and ends with the agent's result, the task deadline, or a
    # withdrawal by keel-api (from image_snapshot only).
    snapshot = ("image_snapshot", "image_pending_upload", "image_uploading")
    for vm in SNAPSHOTTABLE:
        add((vm, None), (vm, snapshot[0]))
        for earlier, task in enumerate(snapshot):
            add((vm, task), (vm, None), *((vm, later) for later in snapshot[earlier + 1 :]))
    # Shelve (services/api/servers/shelve.py, the conductor's services/conductor/
    # shelving.py): the agent powers the guest off and writes the shelved image, then the
    # server is SHELVED, or at once (KEEL_SHELVED_OFFLOAD_TIME 0) offloading: its copy
    # token cleared, the guest destroyed, its claim released and its host cleared
    # (SHELVED_OFFLOADED). A failure, a withdrawal or the task deadline leaves it as it
    # was; an offload always completes (its copy is no longer current).
    for vm in SHELVABLE:
        add((vm, None), (vm, "shelving"))
        add((vm, "shelving"), ("shelved", None), ("shelved", "shelving_offloading"), (vm, None))
    add(("shelved", None), ("shelved", "shelving_offloading"), ("shelved", "unshelving"))
    add(("shelved", "shelving_offloading"), ("shelved_offloaded", None))
    # Unshelve of a SHELVED server: its guest powered on where it is (ACTIVE); a failure,
    # a withdrawal or the task deadline leaves it SHELVED.
    add(("shelved", "unshelving"), ("active", None), ("shelved", None))
    # Unshelve of an offloaded server: scheduled (unshelving), placed (spawning), built
    # from the shelved image (ACTIVE); no valid host, a failed spawn or the deadline send
    # it back to SHELVED_OFFLOADED, its claim released, as Nova does.
    add(("shelved_offloaded", None), ("shelved_offloaded", "unshelving"))
    add(
        ("shelved_offloaded", "unshelving"),
        ("shelved_offloaded", "spawning"),
        ("shelved_offloaded", None),
    )
    add(("shelved_offloaded", "spawning"), ("active", None), ("shelved_offloaded", None))
    # Cold migration: prepare, copy, then VERIFY_RESIZE; failed → ERROR; no valid host or
    # withdrawn → as it was.
    for vm in ("active", "stopped"):
        add((vm, None), (vm, "resize_prep"))
        add((vm, "resize_prep"), (vm, "resize_migrating"), ("error", None), (vm, None))
        add((vm, "resize_migrating"), ("resized", None), ("error", None), (vm, None))
        # Past its deadline with its destination down but not forced down (the copy there
        # may run): shut off on its source (services/conductor/moves/deadline.py).
        add((vm, "resize_migrating"), ("stopped", None))
    # Live migration (services/conductor/moves/live.py): from ACTIVE or PAUSED; done,
    # aborted, failed, timed out or no valid host alike end it as it was (on its
    # destination once done, on its source otherwise).
    for vm in ("active", "paused"):
        add((vm, None), (vm, "migrating"))
        add((vm, "migrating"), (vm, None))
    # Confirm and revert of a VERIFY_RESIZE server (by its owner or the auto-confirm).
    for task in ("resize_confirming", "resize_reverting"):
        add(("resized", None), ("resized", task))
        add(("resized", task), ("active", None), ("stopped", None), ("error", None))
        add(("resized", task), ("resized", None))  # withdrawn by keel-api
    return allowed


INSTANCE: frozenset[tuple[State, State]] = frozenset(_instance_transitions())


def instance_allowed(old: State, new: State) -> bool:
    if old == new:
        return True
    if old[0] == "deleted":
        return False  # nothing comes back from the dead
    if new == DELETED:
        return True  # a delete (local, or once the agent removed the guest) from any state
    if new[1] == "deleting":
        # keel-api marks any live server deleting, state unchanged; a build that ends while
        # the mark is on leaves the server active and marked (instances.set_active).
        return old[0] == new[0] or (old, new) == (("building", "deleting"), ("active", "deleting"))
    if old[1] == "deleting":
        # A delete keel-api could not send is withdrawn (a compare-and-swap while no agent
        # took it: docs/repair.md, "503 that nothing will"): the task it replaced is back.
        return old[0] == new[0]
    return (old, new) in INSTANCE


#: Transitions that may change the instance's node: being scheduled, a move's end, a
#: revert's return to the source, and deletion.
NODE_CHANGES: frozenset[tuple[str | None, str | None]] = frozenset(
    {
        ("scheduling", "spawning"),
        ("rebuilding", None),
        ("resize_migrating", None),
        ("resize_reverting", "resize_reverting"),
        ("migrating", None),
        # A shelve's offload clears the host; an unshelve places the server again, or
        # (no valid host, a failed spawn, its deadline) clears it once more.
        ("shelving_offloading", None),
        ("unshelving", "spawning"),
        ("unshelving", None),
        ("spawning", None),
    }
)


def node_change_allowed(old_task: str | None, new_task: str | None, deleted: bool) -> bool:
    return deleted or (old_task, new_task) in NODE_CHANGES


#: Statuses a move never leaves.
TERMINAL = frozenset({"completed", "confirmed", "reverted", "error", "failed", "cancelled"})
#: Statuses in which a move holds claims on its source and its destination.
CLAIMING = {
    "evacuation": frozenset({"accepted", "pre-migrating", "done"}),
    "migration": frozenset({"accepted", "pre-migrating", "finished", "confirming", "reverting"}),
}
CLAIMING["live-migration"] = frozenset({"accepted", "preparing", "running", "post-migrating"})
#: A resize is a cold migration with a new flavor.
CLAIMING["resize"] = CLAIMING["migration"]
#: The kinds of cold migration.
COLD = frozenset({"migration", "resize"})
#: Statuses in which a move is still being carried out (a destination may be building).
IN_FLIGHT = frozenset(
    {"accepted", "pre-migrating", "migrating", "preparing", "running", "post-migrating"}
)
#: Statuses that may remain at quiescence: a cold migration may wait for its owner.
RESTING = frozenset({"finished"})

MIGRATION: dict[str, frozenset[tuple[str | None, str]]] = {
    "evacuation": frozenset(
        {
            (None, "accepted"),
            ("accepted", "pre-migrating"),
            ("accepted", "error"),  # no valid host, or withdrawn by keel-api
            ("accepted", "failed"),
            ("pre-migrating", "done"),
            ("pre-migrating", "failed"),  # the destination could not rebuild
            ("pre-migrating", "error"),
            ("done", "completed"),  # the source removed its copy
        }
    ),
    "migration": frozenset(
        {
            (None, "accepted"),
            ("accepted", "pre-migrating"),
            ("accepted", "error"),
            ("accepted", "failed"),
            ("pre-migrating", "finished"),
            ("pre-migrating", "failed"),
            ("pre-migrating", "error"),
            ("finished", "confirming"),
            ("finished", "reverting"),
            ("confirming", "confirmed"),
            ("confirming", "error"),
            ("reverting", "reverted"),
            ("reverting", "error"),
            # Deleting a server that awaits confirmation confirms it, as in Nova.
            ("finished", "confirmed"),
        }
    ),
}


MIGRATION["resize"] = MIGRATION["migration"]
MIGRATION["live-migration"] = frozenset(
    {
        (None, "accepted"),
        ("accepted", "preparing"),
        ("accepted", "error"),  # no valid host, or withdrawn by keel-api
        ("preparing", "running"),
        ("preparing", "failed"),  # the destination could not prepare
        ("preparing", "error"),  # past the move deadline
        ("running", "post-migrating"),  # the source's guest is paused: switch over
        ("running", "failed"),
        ("running", "error"),
        ("post-migrating", "completed"),  # the destination's copy runs: the server's
        ("post-migrating", "failed"),  # the destination could not start its copy
    }
)


def migration_allowed(kind: str, old: str | None, new: str) -> bool:
    if old == new:
        return True
    if old in TERMINAL:
        return False
    if new == "cancelled":
        return old is not None
    return (old, new) in MIGRATION.get(kind, frozenset())


class InvalidTransition(ValueError):
    """A writer of states was asked for a transition the table does not have: a bug."""


def require(old: State, new: State) -> None:
    """Raise :class:`InvalidTransition` unless ``old`` → ``new`` is in the table."""
    if not instance_allowed(old, new):
        raise InvalidTransition(f"an instance may not go from {old} to {new}")


def require_begin(
    vm_states: tuple[str, ...], from_tasks: tuple[str | None, ...], task: str
) -> None:
    """For a writer that begins ``task`` on a server in one of ``vm_states`` whose task is
    one of ``from_tasks``: each vm state with no task may begin it; a task it may replace
    (a hard reboot replacing a soft one) must be replaceable in one of them at least — the
    other combinations never exist, and the swap cannot meet them."""
    for begun in from_tasks:
        if begun is None:
            for vm in vm_states:
                require((vm, None), (vm, task))
        else:
            require_task_change(begun, task, vm_states=vm_states)


def require_task_change(
    from_task: str | None,
    to_task: str | None,
    *,
    to_vm: str | None = None,
    vm_states: tuple[str, ...] | None = None,
) -> None:
    """For a writer that swaps the task whatever the vm state (one of ``vm_states``, any
    if None): some vm state with ``from_task`` must be allowed to go to ``to_task``, in
    ``to_vm`` if given (else staying as it is). Raises :class:`InvalidTransition`."""
    for vm in vm_states or _VM_STATES:
        if instance_allowed((vm, from_task), (to_vm or vm, to_task)):
            return
    raise InvalidTransition(
        f"no instance in task {from_task} may go to task {to_task}"
        + (f" in {to_vm}" if to_vm else "")
    )


_VM_STATES = (
    "building",
    "active",
    "stopped",
    "resized",
    "paused",
    "suspended",
    "error",
    "soft-delete",
    "shelved",
    "shelved_offloaded",
)
