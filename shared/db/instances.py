"""Queries on ``instances``. Deleted instances are soft-deleted and hidden by default.

Every write that moves an instance from one state to another is a compare-and-swap: the
``UPDATE`` names the state it expects (``vm_state``, ``task_state``, and the host where
that matters) and changes nothing if the instance is no longer in it. The caller that
gets ``None`` back lost the swap — another delivery of the same message, or another
workflow, got there first — and must do nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

from shared.db import instance_actions, moves
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects import transitions
from shared.objects.compute_node import ComputeNode
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance, InstanceFault
from shared.objects.states import PowerState, TaskState, VmState


async def create(
    conn: Connection,
    *,
    instance_uuid: UUID,
    project_id: str,
    user_id: str,
    display_name: str,
    flavor: FlavorSnapshot,
    image_ref: str,
    availability_zone: str | None,
    reservation_id: str | None = None,
    launch_index: int = 0,
    config_drive: bool = False,
    hostname: str | None = None,
    image_properties: dict[str, str] | None = None,
) -> Instance:
    row = await conn.fetchrow(
        """INSERT INTO instances (uuid, project_id, user_id, display_name, vm_state,
                                  task_state, flavor, image_ref, availability_zone,
                                  reservation_id, launch_index, config_drive, hostname,
                                  image_properties)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
        RETURNING *""",
        instance_uuid,
        project_id,
        user_id,
        display_name,
        VmState.BUILDING.value,
        TaskState.SCHEDULING.value,
        flavor.model_dump(mode="json"),
        image_ref,
        availability_zone,
        reservation_id,
        launch_index,
        config_drive,
        hostname,
        image_properties or {},
    )
    assert row is not None
    return Instance.from_row(row)


def _value(state: TaskState | VmState | None) -> str | None:
    return None if state is None else state.value


async def get(conn: Connection, instance_uuid: UUID) -> Instance:
    row = await conn.fetchrow(
        "SELECT * FROM instances WHERE uuid = $1 AND deleted_at IS NULL", instance_uuid
    )
    if row is None:
        raise InstanceNotFound(f"Instance {instance_uuid} could not be found.")
    return Instance.from_row(row)


async def find(conn: Connection, instance_uuid: UUID) -> Instance | None:
    """The instance, deleted or not; ``None`` if it never existed."""
    row = await conn.fetchrow("SELECT * FROM instances WHERE uuid = $1", instance_uuid)
    return None if row is None else Instance.from_row(row)


async def set_scheduled(
    conn: Connection, instance_uuid: UUID, *, host: str, node: str, compute_id: int
) -> Instance | None:
    """building/scheduling → building/spawning on ``host``/``node``; ``None`` if lost.

    The compute node's id is recorded in the same statement as its names: it is the
    link routing follows. Setting the same placement again is a success (a repeated
    build), so a redelivered build finds the instance where its first delivery put it.
    """
    row = await conn.fetchrow(
        """UPDATE instances SET host = $2, node = $3, compute_id = $7, task_state = $4,
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $5
              AND (task_state = $6
                   OR (task_state = $4 AND host = $2 AND node = $3 AND compute_id = $7))
        RETURNING *""",
        instance_uuid,
        host,
        node,
        TaskState.SPAWNING.value,
        VmState.BUILDING.value,
        TaskState.SCHEDULING.value,
        compute_id,
    )
    return None if row is None else Instance.from_row(row)


async def set_active(
    conn: Connection, instance_uuid: UUID, *, closing: str | None = None
) -> Instance | None:
    """building/spawning → active/running; ``None`` if lost (deleted, or not spawning).

    A server a delete marked ``deleting`` while it was built becomes active and keeps
    that mark: its guest runs whether the delete is carried out or withdrawn (keel-api
    then gives it no task back: :func:`undo_deleting`).

    With ``closing``, the same statement closes the newest open action record of that
    name as a success (``instance_actions.finish``), only if the swap was won: one round
    trip, and one transaction, for both.
    """
    row = await conn.fetchrow(
        """WITH active AS (
               UPDATE instances SET vm_state = $2, power_state = $3,
                      task_state = CASE WHEN task_state = $7 THEN task_state END,
                      launched_at = now(), updated_at = now()
                WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $4
                  AND task_state IN ($5, $7)
               RETURNING *
           ), closed AS (
               UPDATE instance_actions SET finish_time = now(), message = NULL,
                      result = 'Success'
                WHERE id = (SELECT id FROM instance_actions
                             WHERE instance_uuid = $1 AND action = $6
                               AND finish_time IS NULL
                               AND EXISTS (SELECT 1 FROM active)
                             ORDER BY start_time DESC LIMIT 1)
           )
           SELECT * FROM active""",
        instance_uuid,
        VmState.ACTIVE.value,
        int(PowerState.RUNNING),
        VmState.BUILDING.value,
        TaskState.SPAWNING.value,
        closing,
        TaskState.DELETING.value,
    )
    return None if row is None else Instance.from_row(row)


def new_fault(message: str, *, code: int = 500, details: str = "") -> InstanceFault:
    return InstanceFault(code=code, message=message, details=details, created=datetime.now(UTC))


async def set_build_failed(
    conn: Connection,
    instance_uuid: UUID,
    *,
    message: str,
    code: int = 500,
    details: str = "",
) -> Instance | None:
    """building → error with a fault the API shows; ``None`` if lost (not building, or
    being deleted: the delete wins, and its end removes the server)."""
    fault = new_fault(message, code=code, details=details)
    row = await conn.fetchrow(
        """UPDATE instances SET vm_state = $2, task_state = NULL, fault = $3, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $4
              AND task_state IS DISTINCT FROM $5
        RETURNING *""",
        instance_uuid,
        VmState.ERROR.value,
        fault.model_dump(mode="json"),
        VmState.BUILDING.value,
        TaskState.DELETING.value,
    )
    return None if row is None else Instance.from_row(row)


async def expire_builds(conn: Connection, timeout: float, *, batch: int = 100) -> list[Instance]:
    """Put instances building for longer than ``timeout`` seconds in ERROR (not those
    being deleted: the delete's own deadline, ``KEEL_TASK_TIMEOUT``, ends that task).

    Rows another transaction holds are skipped (it is about to change them anyway), so
    several conductors can run this at once without waiting on each other.
    """
    fault = new_fault(
        f"Build of instance aborted: it did not finish within {timeout:g} seconds "
        "(KEEL_BUILD_TIMEOUT)."
    )
    rows = await conn.fetch(
        """UPDATE instances SET vm_state = $2, task_state = NULL, fault = $3, updated_at = now()
            WHERE id IN (SELECT id FROM instances
                          WHERE vm_state = $4 AND deleted_at IS NULL
                            AND task_state IS DISTINCT FROM 'deleting'
                            AND created_at < now() - make_interval(secs => $1)
                          ORDER BY created_at LIMIT $5
                          FOR UPDATE SKIP LOCKED)
              AND vm_state = $4
        RETURNING *""",
        timeout,
        VmState.ERROR.value,
        fault.model_dump(mode="json"),
        VmState.BUILDING.value,
        batch,
    )
    return [Instance.from_row(row) for row in rows]


async def set_task_state(
    conn: Connection, instance_uuid: UUID, task_state: TaskState | None
) -> Instance | None:
    """Set the task state whatever it was (deleting wins over any task); ``None`` if gone."""
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = $2, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL RETURNING *""",
        instance_uuid,
        None if task_state is None else task_state.value,
    )
    return None if row is None else Instance.from_row(row)


async def mark_deleting(conn: Connection, instance_uuid: UUID) -> Instance | None:
    """Mark the instance ``deleting`` whatever its task (deleting wins over any task); the
    instance as it was just before, which a withdrawn delete gives its task back from
    (not an earlier read: a task may have moved on since); ``None`` if gone."""
    row = await conn.fetchrow(
        """WITH before AS (
               SELECT * FROM instances WHERE uuid = $1 AND deleted_at IS NULL FOR UPDATE
           )
           UPDATE instances i SET task_state = $2, updated_at = now()
             FROM before
            WHERE i.id = before.id
        RETURNING before.*""",
        instance_uuid,
        TaskState.DELETING.value,
    )
    return None if row is None else Instance.from_row(row)


async def swap_task_state(
    conn: Connection,
    instance_uuid: UUID,
    *,
    expected: TaskState | None,
    new: TaskState | None,
) -> Instance | None:
    """``expected`` → ``new`` task state; ``None`` if lost (gone, or in another state)."""
    transitions.require_task_change(_value(expected), _value(new))
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = $2, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state IS NOT DISTINCT FROM $3
        RETURNING *""",
        instance_uuid,
        None if new is None else new.value,
        None if expected is None else expected.value,
    )
    return None if row is None else Instance.from_row(row)


async def undo_deleting(
    conn: Connection, instance_uuid: UUID, *, found: Instance, task: TaskState | None
) -> Instance | None:
    """``deleting`` → ``task``, the task a withdrawn delete found on the server (as
    ``found``, read before it marked it); no task if the server has left ``found``'s vm
    state since: what that task did ended meanwhile (a build whose guest runs now).
    ``None`` if lost (gone, or no longer ``deleting``)."""
    transitions.require_task_change(TaskState.DELETING.value, _value(task))
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = CASE WHEN vm_state = $3 THEN $2 END,
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $4
        RETURNING *""",
        instance_uuid,
        _value(task),
        found.vm_state,
        TaskState.DELETING.value,
    )
    return None if row is None else Instance.from_row(row)


#: The tasks a delete marks a server with: a delete's, a soft delete's.
DELETE_MARKS = (TaskState.DELETING.value, TaskState.SOFT_DELETING.value)


async def marked_for_delete(conn: Connection, instance_uuid: UUID) -> bool:
    """Whether a delete's mark (:data:`DELETE_MARKS`) is the instance's task."""
    task = await conn.fetchval(
        "SELECT task_state FROM instances WHERE uuid = $1 AND deleted_at IS NULL",
        instance_uuid,
    )
    return task in DELETE_MARKS


async def begin_task(
    conn: Connection,
    instance_uuid: UUID,
    task: TaskState,
    *,
    vm_states: Sequence[VmState],
    from_tasks: Sequence[TaskState | None] = (None,),
    claimed_in_error: bool = False,
) -> Instance | None:
    """Start ``task`` if the instance is in one of ``vm_states`` with a task in ``from_tasks``
    (and, with ``claimed_in_error``, holds a claim on its node if it is in ERROR).

    ``None`` if the swap was lost (gone, or in another state): the caller refuses with 409.
    """
    transitions.require_begin(
        tuple(vm.value for vm in vm_states), tuple(_value(t) for t in from_tasks), task.value
    )
    allowed_tasks = [t.value for t in from_tasks if t is not None]
    row = await conn.fetchrow(
        """UPDATE instances i SET task_state = $2, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = ANY($3::text[])
              AND (task_state = ANY($4::text[]) OR ($5 AND task_state IS NULL))
              AND (NOT $6 OR vm_state <> $7
                   OR EXISTS (SELECT 1 FROM allocations a
                               WHERE a.consumer_uuid = i.uuid
                                 AND a.compute_node_id = i.compute_id))
        RETURNING *""",
        instance_uuid,
        task.value,
        [state.value for state in vm_states],
        allowed_tasks,
        None in from_tasks,
        claimed_in_error,
        VmState.ERROR.value,
    )
    return None if row is None else Instance.from_row(row)


async def finish_task(
    conn: Connection,
    instance_uuid: UUID,
    tasks: Sequence[TaskState],
    *,
    vm_state: VmState | None = None,
    power_state: PowerState | None = None,
) -> Instance | None:
    """End one of ``tasks``, setting the states it led to; ``None`` if lost (not in it).

    Ending in SOFT_DELETED stamps ``soft_deleted_at`` (the reclaim sweep's clock); ending
    in any other vm state clears it.
    """
    for task in tasks:
        transitions.require_task_change(task.value, None, to_vm=_value(vm_state))
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = NULL, updated_at = now(),
                  vm_state = COALESCE($3, vm_state), power_state = COALESCE($4, power_state),
                  soft_deleted_at = CASE WHEN COALESCE($3, vm_state) = $5
                                         THEN COALESCE(soft_deleted_at, now()) END
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = ANY($2::text[])
        RETURNING *""",
        instance_uuid,
        [task.value for task in tasks],
        None if vm_state is None else vm_state.value,
        None if power_state is None else int(power_state),
        VmState.SOFT_DELETED.value,
    )
    return None if row is None else Instance.from_row(row)


async def move_to(
    conn: Connection,
    instance_uuid: UUID,
    *,
    task: TaskState,
    node: ComputeNode,
    vm_state: VmState,
    power_state: PowerState,
    flavor: FlavorSnapshot | None = None,
    copy_token: UUID | None = None,
) -> Instance | None:
    """End ``task`` with the instance now on ``node`` (names and id in one statement),
    with ``flavor`` if given (a resize), and ``copy_token`` as its current copy's token if
    given (a move that built a new copy).

    ``None`` if lost: the instance is gone, or not in that task any more.
    """
    row = await conn.fetchrow(
        """UPDATE instances SET host = $3, node = $4, compute_id = $5, vm_state = $6,
                  power_state = $7, task_state = NULL, updated_at = now(),
                  flavor = COALESCE($8, flavor), copy_token = COALESCE($9, copy_token)
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $2
        RETURNING *""",
        instance_uuid,
        task.value,
        node.host,
        node.hypervisor_hostname,
        node.id,
        vm_state.value,
        int(power_state),
        None if flavor is None else flavor.model_dump(mode="json"),
        copy_token,
    )
    return None if row is None else Instance.from_row(row)


async def set_copy_token(conn: Connection, instance_uuid: UUID, token: UUID | None) -> None:
    """Make the copy carrying ``token`` the server's current one (see
    :mod:`shared.copy_tokens`)."""
    await conn.execute(
        "UPDATE instances SET copy_token = $2 WHERE uuid = $1 AND deleted_at IS NULL",
        instance_uuid,
        token,
    )


async def relink(
    conn: Connection,
    instance_uuid: UUID,
    *,
    task: TaskState,
    node: ComputeNode,
    flavor: FlavorSnapshot | None = None,
    copy_token: UUID | None = None,
    set_token: bool = False,
) -> Instance | None:
    """Link the instance to ``node`` during ``task``, which goes on; with ``flavor`` if
    given (a reverted resize gets its old flavor back), and, with ``set_token``,
    ``copy_token`` as its current copy's token (the copy a revert returns to; ``None``: a
    copy built before tokens).

    ``None`` if lost: the instance is gone, or not in that task any more.
    """
    row = await conn.fetchrow(
        """UPDATE instances SET host = $3, node = $4, compute_id = $5, updated_at = now(),
                  flavor = COALESCE($6, flavor),
                  copy_token = CASE WHEN $7 THEN $8 ELSE copy_token END
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $2
        RETURNING *""",
        instance_uuid,
        task.value,
        node.host,
        node.hypervisor_hostname,
        node.id,
        None if flavor is None else flavor.model_dump(mode="json"),
        set_token,
        copy_token,
    )
    return None if row is None else Instance.from_row(row)


async def fail_task(
    conn: Connection, instance_uuid: UUID, task: TaskState, *, message: str
) -> Instance | None:
    """End ``task`` in ERROR with a fault, the instance where it was; ``None`` if lost."""
    transitions.require_task_change(task.value, None, to_vm=VmState.ERROR.value)
    fault = new_fault(message)
    row = await conn.fetchrow(
        """UPDATE instances SET vm_state = $3, task_state = NULL, fault = $4, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $2 RETURNING *""",
        instance_uuid,
        task.value,
        VmState.ERROR.value,
        fault.model_dump(mode="json"),
    )
    return None if row is None else Instance.from_row(row)


async def soft_delete_unplaced(conn: Connection, instance_uuid: UUID) -> bool:
    """Soft-delete the instance only while no host is recorded for it.

    False if it is gone or was placed meanwhile: a guest may then be on its way to a
    host, and only that host's agent can remove it.
    """
    status = await conn.execute(
        """UPDATE instances SET vm_state = $2, task_state = NULL, power_state = $3,
                  terminated_at = now(), deleted_at = now(), updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND host IS NULL""",
        instance_uuid,
        VmState.DELETED.value,
        int(PowerState.NOSTATE),
    )
    return status != "UPDATE 0"


async def soft_delete(conn: Connection, instance_uuid: UUID) -> bool:
    """Mark the instance deleted; False if it already was (idempotent).

    Delete wins over any move (:func:`shared.db.moves.cancel_for_delete`): one under way
    ends ``cancelled``; a cold migration that was waiting for confirm or revert ends
    ``confirmed``, as Nova's delete of a resized server does. The copies on both hosts go
    with the instance.
    """
    status = await conn.execute(
        """UPDATE instances SET vm_state = $2, task_state = NULL, power_state = $3,
                  terminated_at = now(), deleted_at = now(), updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL""",
        instance_uuid,
        VmState.DELETED.value,
        int(PowerState.NOSTATE),
    )
    if status == "UPDATE 0":
        return False
    await moves.cancel_for_delete(conn, instance_uuid)
    return True


async def begin_reclaim(conn: Connection, interval: float, *, batch: int = 100) -> list[Instance]:
    """Mark ``deleting`` the soft-deleted servers (with no task) whose soft delete is more
    than ``interval`` seconds old: the reclaim sweep deletes them for good.

    Rows another transaction holds are skipped, and the swap names the state it expects,
    so two conductors sweeping at once never both take the same server.
    """
    transitions.require(
        (VmState.SOFT_DELETED.value, None), (VmState.SOFT_DELETED.value, TaskState.DELETING.value)
    )
    rows = await conn.fetch(
        """UPDATE instances SET task_state = $2, updated_at = now()
            WHERE id IN (SELECT id FROM instances
                          WHERE vm_state = $3 AND task_state IS NULL AND deleted_at IS NULL
                            AND soft_deleted_at < now() - make_interval(secs => $1)
                          ORDER BY soft_deleted_at LIMIT $4
                          FOR UPDATE SKIP LOCKED)
              AND vm_state = $3 AND task_state IS NULL AND deleted_at IS NULL
        RETURNING *""",
        interval,
        TaskState.DELETING.value,
        VmState.SOFT_DELETED.value,
        batch,
    )
    return [Instance.from_row(row) for row in rows]


class NotResettable(Exception):
    """An admin's reset would break what keel promised (nothing changed); the message
    says why, and what to do instead."""


async def reset_state(
    conn: Connection, instance_uuid: UUID, vm_state: VmState
) -> tuple[Instance, Instance] | None:
    """An admin's reset: ``vm_state`` set and the task cleared, whatever they were.

    Returns the row before and after (locked for the rest of the transaction); ``None``
    if the instance is gone. Raises :class:`NotResettable` (nothing changed) for a reset
    to ACTIVE of a server whose build never succeeded (no guest of it exists anywhere), a
    server being deleted (its agent may be destroying its guest: the delete goes on), one
    soft-deleted (a restore brings it back with its guest started; a reset would leave it
    ACTIVE with its guest off), one offloaded or being offloaded (its copy is its
    shelved image, which a state on a host would leave behind), and a reset to ACTIVE of
    a server in ERROR because its last rebuild failed (its old guest may be gone).
    """
    before = await conn.fetchrow(
        "SELECT * FROM instances WHERE uuid = $1 AND deleted_at IS NULL FOR UPDATE",
        instance_uuid,
    )
    if before is None:
        return None
    server = f"Server {instance_uuid}"
    if vm_state == VmState.ACTIVE and before["launched_at"] is None:
        raise NotResettable(
            f"{server} was never built: no guest of it exists, so it cannot be made "
            "active. Reset it to error, or delete it."
        )
    if (
        vm_state == VmState.ACTIVE
        and before["vm_state"] == VmState.ERROR.value
        and await instance_actions.latest_failed(conn, instance_uuid, "rebuild")
    ):
        raise NotResettable(
            f"{server} is in error because its last rebuild failed: its old guest may be "
            "gone and no new one runs, so it cannot be made active. Rebuild it again, or "
            "delete it."
        )
    if before["task_state"] == TaskState.DELETING.value:
        raise NotResettable(
            f"{server} is being deleted: its state cannot be reset. If its compute service "
            "is down, delete it again to delete it without its agent."
        )
    if before["task_state"] == TaskState.SOFT_DELETING.value:
        raise NotResettable(
            f"{server} is being soft-deleted (a delete keel-api accepted): its state cannot "
            "be reset. Restore it once it is soft-deleted, or force-delete it."
        )
    if before["vm_state"] == VmState.SOFT_DELETED.value:
        raise NotResettable(
            f"{server} is soft-deleted: its state cannot be reset. Restore it (openstack "
            "server restore) to bring it back, or force-delete it."
        )
    offloading = before["task_state"] == TaskState.SHELVING_OFFLOADING.value
    if offloading or before["vm_state"] == VmState.SHELVED_OFFLOADED.value:
        raise NotResettable(
            f"{server} is shelved and offloaded, or being offloaded: its copy is its "
            "shelved image, not a guest on a host, so its state cannot be reset. Unshelve "
            "it, or delete it."
        )
    after = await conn.fetchrow(
        """UPDATE instances SET vm_state = $2, task_state = NULL, updated_at = now()
            WHERE uuid = $1 RETURNING *""",
        instance_uuid,
        vm_state.value,
    )
    assert after is not None
    return Instance.from_row(before), Instance.from_row(after)


async def live_projects(conn: Connection) -> list[str]:
    """The projects that have live servers."""
    rows = await conn.fetch(
        "SELECT DISTINCT project_id FROM instances WHERE deleted_at IS NULL ORDER BY project_id"
    )
    return [row["project_id"] for row in rows]


async def set_lock(
    conn: Connection, instance_uuid: UUID, locked_by: str | None, reason: str | None
) -> bool:
    """Lock (``locked_by`` ``owner`` or ``admin``) or unlock (``None``) a live instance;
    False if there is none. Setting the same lock twice changes nothing."""
    status = await conn.execute(
        """UPDATE instances SET locked_by = $2, locked_reason = $3
            WHERE uuid = $1 AND deleted_at IS NULL""",
        instance_uuid,
        locked_by,
        reason if locked_by is not None else None,
    )
    return status != "UPDATE 0"
