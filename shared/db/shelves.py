"""The rows of a shelved server: its states, its system metadata and its shelved image.

A shelve is a snapshot that ends the server's life on its host (Nova's ``shelve``):

* :func:`begin` (keel-api, one transaction): task ``shelving`` (a compare-and-swap from
  one of :data:`SHELVABLE` with no task), the image ``<name>-shelved`` queued as a
  snapshot's is, and its id in the server's system metadata (``shelved_image_id``);
* :func:`shelved` (the conductor, on the agent's result): SHELVED, power state shutdown,
  ``shelved_at`` and ``shelved_host`` recorded; or, offloading at once, task
  ``shelving_offloading`` with the server's copy token replaced, in the same statement, by
  a new one no guest carries (not cleared: a guest built before copy tokens carries
  none): from then on its guest is not the server's current copy
  (:mod:`shared.copy_tokens`), so it may be destroyed;
* :func:`begin_offload` (``shelveOffload``, or the offload sweep): the same, from SHELVED;
* :func:`offloaded` (the agent destroyed the guest, or the task deadline): SHELVED_OFFLOADED,
  host, node and claim gone;
* unshelving an offloaded server: :func:`begin_unshelve` (keel-api: task ``unshelving`` and
  a new copy token), :func:`placed` (the conductor: task ``spawning`` on the chosen host),
  then :func:`unshelved` (the build's success: ACTIVE, the shelved image deleted, the
  system metadata keys removed) or :func:`back_to_offloaded` (no valid host, a failed
  spawn, the deadline: SHELVED_OFFLOADED again with a fault, claim released, no copy
  current);
* unshelving a SHELVED server powers its guest on where it is: :func:`unshelved` too.

Every writer is a compare-and-swap on the state it expects, so a repeated message finds
the step done and changes nothing.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from shared.db import allocations, images, snapshots
from shared.db.instances import finish_task, marked_for_delete, new_fault
from shared.db.pool import Connection
from shared.exceptions import ImageNotFound, ImageProtected
from shared.objects import transitions
from shared.objects.instance import Allocation, Instance
from shared.objects.states import PowerState, TaskState, VmState

LOG = logging.getLogger(__name__)

#: The vm states a shelve starts from (with no task), as in Nova.
SHELVABLE = tuple(VmState(vm) for vm in transitions.SHELVABLE)

#: The system metadata a shelved server keeps (Nova's keys).
IMAGE_KEY = "shelved_image_id"
AT_KEY = "shelved_at"
HOST_KEY = "shelved_host"
KEYS = (IMAGE_KEY, AT_KEY, HOST_KEY)

#: The tasks of an unshelve of an offloaded server (scheduled, then spawning).
UNSHELVE_BUILD_TASKS = (TaskState.UNSHELVING, TaskState.SPAWNING)


def image_name(instance: Instance) -> str:
    """The shelved image's name, as Nova names it."""
    return f"{instance.display_name}-shelved"


def shelved_image(instance: Instance) -> UUID | None:
    """The id of the server's shelved image, if it has one."""
    value = instance.system_metadata.get(IMAGE_KEY)
    try:
        return None if value is None else UUID(value)
    except ValueError:
        return None


async def begin(
    conn: Connection,
    instance_uuid: UUID,
    *,
    image_id: UUID,
    name: str,
    owner: str,
    disk_format: str,
    min_disk: int,
    min_ram: int,
    properties: dict[str, Any],
) -> Instance | None:
    """Start the shelve: the task, the ``queued`` image and its id in the system metadata;
    ``None`` if the swap was lost (the caller answers 409)."""
    begun = await snapshots.begin(
        conn,
        instance_uuid,
        image_id=image_id,
        name=name,
        owner=owner,
        disk_format=disk_format,
        min_disk=min_disk,
        min_ram=min_ram,
        properties=properties,
        task=TaskState.SHELVING,
        vm_states=SHELVABLE,
    )
    if begun is None:
        return None
    row = await conn.fetchrow(
        """UPDATE instances
              SET system_metadata = system_metadata || jsonb_build_object($2::text, $3::text)
            WHERE uuid = $1 RETURNING *""",
        instance_uuid,
        IMAGE_KEY,
        str(image_id),
    )
    return None if row is None else Instance.from_row(row)


async def _forget(conn: Connection, instance_uuid: UUID) -> None:
    await conn.execute(
        """UPDATE instances SET system_metadata = system_metadata - $2::text[]
            WHERE uuid = $1""",
        instance_uuid,
        list(KEYS),
    )


async def withdraw(conn: Connection, instance_uuid: UUID) -> bool:
    """keel-api withdraws a shelve no agent took: undone as :func:`failed` does; under a
    delete's mark (it replaced the task) the mark stays, and the image and the system
    metadata keys go. False if the task already moved on otherwise."""
    if await failed(conn, instance_uuid) is not None:
        return True
    if not await marked_for_delete(conn, instance_uuid):
        return False
    await snapshots.kill_unfinished(conn, instance_uuid)
    await _forget(conn, instance_uuid)
    return True


async def failed(conn: Connection, instance_uuid: UUID) -> Instance | None:
    """Undo :func:`begin` (a failed or withdrawn shelve, or one past the task deadline):
    the task cleared, the vm state as it was, the unfinished image killed, the system
    metadata keys removed. ``None`` if the server was not shelving."""
    done = await finish_task(conn, instance_uuid, (TaskState.SHELVING,))
    if done is None:
        return None
    await snapshots.kill_unfinished(conn, instance_uuid)
    await _forget(conn, instance_uuid)
    return done


async def shelved(
    conn: Connection, instance_uuid: UUID, *, offload: bool, now: datetime | None = None
) -> Instance | None:
    """The agent's shelve succeeded: SHELVED, or (``offload``) SHELVED with task
    ``shelving_offloading`` and no current copy. ``None`` if the server was not shelving."""
    task = TaskState.SHELVING_OFFLOADING if offload else None
    for vm in SHELVABLE:
        transitions.require((vm, TaskState.SHELVING.value), (VmState.SHELVED.value, task))
    at = (now or datetime.now(UTC)).isoformat()
    row = await conn.fetchrow(
        """UPDATE instances
              SET vm_state = $2, power_state = $3, task_state = $4,
                  copy_token = CASE WHEN $5 THEN gen_random_uuid() ELSE copy_token END,
                  system_metadata = system_metadata
                      || jsonb_build_object($6::text, $7::text, $8::text, COALESCE(host, '')),
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $9
        RETURNING *""",
        instance_uuid,
        VmState.SHELVED.value,
        int(PowerState.SHUTDOWN),
        None if task is None else task.value,
        offload,
        AT_KEY,
        at,
        HOST_KEY,
        TaskState.SHELVING.value,
    )
    return None if row is None else Instance.from_row(row)


async def begin_offload(conn: Connection, instance_uuid: UUID) -> Instance | None:
    """SHELVED with no task → task ``shelving_offloading``, its copy token replaced by one
    no guest carries in the same statement; ``None`` if the server was not so."""
    transitions.require(
        (VmState.SHELVED.value, None),
        (VmState.SHELVED.value, TaskState.SHELVING_OFFLOADING.value),
    )
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = $2, copy_token = gen_random_uuid(), updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $3 AND task_state IS NULL
        RETURNING *""",
        instance_uuid,
        TaskState.SHELVING_OFFLOADING.value,
        VmState.SHELVED.value,
    )
    return None if row is None else Instance.from_row(row)


async def offloaded(
    conn: Connection, instance_uuid: UUID
) -> tuple[Instance, list[Allocation]] | None:
    """End the offload: SHELVED_OFFLOADED, no host, node or copy, its claims released.
    ``None`` if the server was not offloading."""
    transitions.require(
        (VmState.SHELVED.value, TaskState.SHELVING_OFFLOADING.value),
        (VmState.SHELVED_OFFLOADED.value, None),
    )
    row = await conn.fetchrow(
        """UPDATE instances SET vm_state = $2, task_state = NULL, power_state = $3,
                  host = NULL, node = NULL, compute_id = NULL, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = $4
        RETURNING *""",
        instance_uuid,
        VmState.SHELVED_OFFLOADED.value,
        int(PowerState.SHUTDOWN),
        TaskState.SHELVING_OFFLOADING.value,
    )
    if row is None:
        return None
    released = await allocations.release_instance(conn, instance_uuid)
    return Instance.from_row(row), released


async def begin_unshelve(conn: Connection, instance_uuid: UUID, token: UUID) -> Instance | None:
    """SHELVED_OFFLOADED with no task → task ``unshelving``, with ``token`` as the copy
    token its new guest will carry; ``None`` if the server was not so."""
    transitions.require(
        (VmState.SHELVED_OFFLOADED.value, None),
        (VmState.SHELVED_OFFLOADED.value, TaskState.UNSHELVING.value),
    )
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = $2, copy_token = $3, fault = NULL,
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $4 AND task_state IS NULL
        RETURNING *""",
        instance_uuid,
        TaskState.UNSHELVING.value,
        token,
        VmState.SHELVED_OFFLOADED.value,
    )
    return None if row is None else Instance.from_row(row)


async def withdraw_unshelve(conn: Connection, instance_uuid: UUID) -> bool:
    """Undo :func:`begin_unshelve` while nothing was placed; False if it moved on."""
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = NULL, copy_token = gen_random_uuid(),
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $2 AND task_state = $3
              AND compute_id IS NULL
        RETURNING uuid""",
        instance_uuid,
        VmState.SHELVED_OFFLOADED.value,
        TaskState.UNSHELVING.value,
    )
    return row is not None


async def placed(
    conn: Connection, instance_uuid: UUID, *, host: str, node: str, compute_id: int
) -> Instance | None:
    """unshelving → spawning on ``host``/``node`` (or already spawning there); ``None`` if
    the swap was lost."""
    transitions.require(
        (VmState.SHELVED_OFFLOADED.value, TaskState.UNSHELVING.value),
        (VmState.SHELVED_OFFLOADED.value, TaskState.SPAWNING.value),
    )
    row = await conn.fetchrow(
        """UPDATE instances SET host = $2, node = $3, compute_id = $4, task_state = $5,
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $6
              AND (task_state = $7 OR (task_state = $5 AND compute_id = $4))
        RETURNING *""",
        instance_uuid,
        host,
        node,
        compute_id,
        TaskState.SPAWNING.value,
        VmState.SHELVED_OFFLOADED.value,
        TaskState.UNSHELVING.value,
    )
    return None if row is None else Instance.from_row(row)


async def unshelved(conn: Connection, instance_uuid: UUID) -> tuple[Instance, UUID | None] | None:
    """The guest runs again (spawned from the shelved image, or powered on where it was
    shelved): ACTIVE, the system metadata keys removed and the shelved image deleted.
    The server and the image deleted; ``None`` if the server was not unshelving."""
    for old in (
        (VmState.SHELVED.value, TaskState.UNSHELVING.value),
        (VmState.SHELVED_OFFLOADED.value, TaskState.SPAWNING.value),
    ):
        transitions.require(old, (VmState.ACTIVE.value, None))
    before = await conn.fetchrow(
        """SELECT system_metadata->>$2 AS image FROM instances
            WHERE uuid = $1 AND deleted_at IS NULL FOR UPDATE""",
        instance_uuid,
        IMAGE_KEY,
    )
    row = await conn.fetchrow(
        """UPDATE instances SET vm_state = $2, power_state = $3, task_state = NULL,
                  system_metadata = system_metadata - $4::text[], fault = NULL,
                  launched_at = COALESCE(launched_at, now()), updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL
              AND ((vm_state = $5 AND task_state = $6) OR (vm_state = $7 AND task_state = $8))
        RETURNING *""",
        instance_uuid,
        VmState.ACTIVE.value,
        int(PowerState.RUNNING),
        list(KEYS),
        VmState.SHELVED.value,
        TaskState.UNSHELVING.value,
        VmState.SHELVED_OFFLOADED.value,
        TaskState.SPAWNING.value,
    )
    if row is None:
        return None
    image_id = await delete_image(conn, before["image"] if before else None)
    return Instance.from_row(row), image_id


async def delete_image(conn: Connection, value: str | None) -> UUID | None:
    """Delete the shelved image ``value`` names, if it still exists; its id if it did.

    A shelved image its owner made ``protected`` stays (``None``), as Nova's deletion of
    it is refused by the Image API and Nova goes on without it.
    """
    if value is None:
        return None
    try:
        image_id = UUID(value)
        await images.delete(conn, image_id)
    except (ValueError, ImageNotFound):
        return None
    except ImageProtected:
        LOG.warning("shelved image %s is protected: it is kept", value)
        return None
    return image_id


async def delete_image_of_deleted(conn: Connection, instance_uuid: UUID) -> UUID | None:
    """A deleted server's shelved image goes with it, as in Nova; its id if it existed."""
    value = await conn.fetchval(
        """SELECT system_metadata->>$2 FROM instances
            WHERE uuid = $1 AND deleted_at IS NOT NULL""",
        instance_uuid,
        IMAGE_KEY,
    )
    return await delete_image(conn, value)


async def back_to_offloaded(
    conn: Connection, instance_uuid: UUID, message: str
) -> tuple[Instance, list[Allocation]] | None:
    """An unshelve of an offloaded server that could not be carried out: SHELVED_OFFLOADED
    again with ``message`` as its fault, no host, no current copy, its claims released.
    ``None`` if the server was not unshelving from SHELVED_OFFLOADED."""
    for task in UNSHELVE_BUILD_TASKS:
        transitions.require(
            (VmState.SHELVED_OFFLOADED.value, task.value),
            (VmState.SHELVED_OFFLOADED.value, None),
        )
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = NULL, host = NULL, node = NULL,
                  compute_id = NULL, copy_token = gen_random_uuid(), fault = $2,
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $3
              AND task_state = ANY($4::text[])
        RETURNING *""",
        instance_uuid,
        new_fault(message).model_dump(mode="json"),
        VmState.SHELVED_OFFLOADED.value,
        [task.value for task in UNSHELVE_BUILD_TASKS],
    )
    if row is None:
        return None
    released = await allocations.release_instance(conn, instance_uuid)
    return Instance.from_row(row), released


async def end_unshelve_in_place(conn: Connection, instance_uuid: UUID) -> Instance | None:
    """An unshelve of a SHELVED server that failed or overran: SHELVED again, as it was.
    ``None`` if the server was not unshelving in place."""
    transitions.require(
        (VmState.SHELVED.value, TaskState.UNSHELVING.value), (VmState.SHELVED.value, None)
    )
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = NULL, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND vm_state = $2 AND task_state = $3
        RETURNING *""",
        instance_uuid,
        VmState.SHELVED.value,
        TaskState.UNSHELVING.value,
    )
    return None if row is None else Instance.from_row(row)
