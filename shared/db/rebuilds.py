"""The rows of a rebuild: begun by keel-api, ended by the agent's result or withdrawn.

A rebuild changes what the server is made from (its image) and, as the request says,
its name, metadata, description, access addresses, key pair and user data. keel-api
writes all of it with the task, in one compare-and-swap, so a client reading the server
meanwhile sees what it will be (as in Nova); a withdrawal (the message could not be
confirmed sent, and no agent took it) puts every field back as it was, so a 503 means
nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from shared.db import allocations
from shared.db.instances import DELETE_MARKS, new_fault
from shared.db.pool import Connection
from shared.objects import transitions
from shared.objects.instance import Instance
from shared.objects.states import PowerState, TaskState, VmState

#: The vm states a rebuild starts from (with no task), as in Nova.
REBUILDABLE = (VmState.ACTIVE, VmState.STOPPED, VmState.ERROR)

#: The columns a rebuild may change, in the order :class:`RebuildChange` holds them.
_COLUMNS = (
    "image_ref",
    "image_properties",
    "hostname",
    "display_name",
    "metadata",
    "description",
    "access_ip_v4",
    "access_ip_v6",
    "key_name",
    "key_data",
    "user_data",
)


class Unclaimed(Exception):
    """The server holds no claim on its node (its build never succeeded there, or a move
    ended with its claim elsewhere): a guest made there would run on resources nobody
    accounts for."""


@dataclass(frozen=True)
class RebuildChange:
    """What a rebuild sets; only the fields in ``given`` change (the image and what the
    server keeps of its properties always)."""

    image_ref: str
    #: What the server keeps of the new image's properties (shown from 2.98).
    image_properties: dict[str, str] = field(default_factory=dict)
    hostname: str | None = None
    display_name: str | None = None
    metadata: dict[str, str] | None = None
    description: str | None = None
    access_ip_v4: str | None = None
    access_ip_v6: str | None = None
    key_name: str | None = None
    key_data: str | None = None
    user_data: str | None = None
    given: frozenset[str] = frozenset()

    def values(self) -> dict[str, Any]:
        wanted = {"image_ref", "image_properties", *self.given}
        return {column: getattr(self, column) for column in _COLUMNS if column in wanted}


def _assignments(values: dict[str, Any], first: int) -> tuple[str, list[Any]]:
    parts = []
    args: list[Any] = []
    for offset, (column, value) in enumerate(values.items()):
        parts.append(f"{column} = ${first + offset}")
        args.append(value)
    return ", ".join(parts), args


async def begin(
    conn: Connection, instance_uuid: UUID, change: RebuildChange
) -> tuple[Instance, Instance] | None:
    """Start the rebuild: task ``rebuild_spawning`` and the new fields, if the server is
    in one of :data:`REBUILDABLE` with no task. ``(before, after)``; ``None`` if the swap
    was lost (the caller answers 409). Raises :class:`Unclaimed` (nothing changed) if the
    server holds no claim of its own on its node."""
    transitions.require_begin(
        tuple(vm.value for vm in REBUILDABLE), (None,), TaskState.REBUILD_SPAWNING.value
    )
    before = await conn.fetchrow(
        """SELECT * FROM instances
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state IS NULL
              AND vm_state = ANY($2::text[])
              FOR UPDATE""",
        instance_uuid,
        [vm.value for vm in REBUILDABLE],
    )
    if before is None:
        return None
    if not await allocations.held_on_node(conn, instance_uuid, before["compute_id"]):
        raise Unclaimed(str(instance_uuid))
    sets, args = _assignments(change.values(), 3)
    after = await conn.fetchrow(
        f"""UPDATE instances SET task_state = $2, {sets}, updated_at = now()
             WHERE uuid = $1
         RETURNING *""",
        instance_uuid,
        TaskState.REBUILD_SPAWNING.value,
        *args,
    )
    assert after is not None  # the row is locked above
    return Instance.from_row(before), Instance.from_row(after)


async def withdraw(conn: Connection, before: Instance, change: RebuildChange) -> bool:
    """Undo :func:`begin` while the rebuild is still under way: the task and every field
    it changed back as they were. Under a delete's mark (it replaced the task) the mark
    stays and the fields go back. False if the task already moved on otherwise."""
    old = {column: getattr(before, column) for column in change.values()}
    sets, args = _assignments(old, 4)
    row = await conn.fetchrow(
        f"""UPDATE instances
               SET task_state = CASE WHEN task_state = $2 THEN NULL ELSE task_state END,
                   {sets}, updated_at = now()
             WHERE uuid = $1 AND deleted_at IS NULL
               AND (task_state = $2 OR task_state = ANY($3::text[]))
         RETURNING uuid""",
        before.uuid,
        TaskState.REBUILD_SPAWNING.value,
        list(DELETE_MARKS),
        *args,
    )
    return row is not None


async def end(
    conn: Connection, instance_uuid: UUID, *, success: bool, message: str = ""
) -> Instance | None:
    """End the rebuild as its agent reported: a SHUTOFF server stays SHUTOFF, any other
    is ACTIVE (launched now); a failure is ERROR with ``message`` as its fault. ``None``
    if the server is not rebuilding (a repeated result, or deleted meanwhile)."""
    task = TaskState.REBUILD_SPAWNING.value
    for vm in REBUILDABLE:
        done = VmState.STOPPED if vm is VmState.STOPPED else VmState.ACTIVE
        transitions.require((vm.value, task), ((done if success else VmState.ERROR).value, None))
    if success:
        row = await conn.fetchrow(
            """UPDATE instances
                  SET task_state = NULL, updated_at = now(), launched_at = now(),
                      vm_state = CASE WHEN vm_state = $3::text THEN $3::text ELSE $4::text END,
                      power_state = CASE WHEN vm_state = $3::text THEN $5::int ELSE $6::int END
                WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $2
            RETURNING *""",
            instance_uuid,
            task,
            VmState.STOPPED.value,
            VmState.ACTIVE.value,
            int(PowerState.SHUTDOWN),
            int(PowerState.RUNNING),
        )
    else:
        fault = new_fault(f"Rebuild of the server failed: {message}")
        row = await conn.fetchrow(
            """UPDATE instances
                  SET task_state = NULL, updated_at = now(), vm_state = $3, fault = $4,
                      power_state = $5::int
                WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $2
            RETURNING *""",
            instance_uuid,
            task,
            VmState.ERROR.value,
            fault.model_dump(mode="json"),
            int(PowerState.NOSTATE),
        )
    return None if row is None else Instance.from_row(row)
