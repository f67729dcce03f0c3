"""The rows of a server snapshot (``createImage``): the server's task and its image.

keel-api begins a snapshot in one transaction: the server's task ``image_snapshot`` (a
compare-and-swap from one of :data:`~shared.objects.transitions.SNAPSHOTTABLE` with no
task) and the image, ``queued`` and owned by the server's project. The agent's upload
moves the task on (``image_pending_upload`` when it arrives, ``image_uploading`` once
its data streams) and makes the image ``active`` once whole; the agent's result ends the
task. A snapshot that fails, is withdrawn or overruns the task deadline leaves no image:
the unfinished one is killed (``killed`` and deleted, as Glance shows a failed upload).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from shared.db import images
from shared.db.instances import begin_task, finish_task, marked_for_delete
from shared.db.pool import Connection
from shared.objects import transitions
from shared.objects.image import Image
from shared.objects.instance import Instance
from shared.objects.states import SNAPSHOT_TASKS, TaskState, VmState

#: The vm states a snapshot starts from (with no task), as in Nova.
SNAPSHOTTABLE = tuple(VmState(vm) for vm in transitions.SNAPSHOTTABLE)

#: What a server snapshot's ``image_type`` property says (the request's metadata may
#: say otherwise, as in Nova: a snapshot is known by its ``instance_uuid``).
IMAGE_TYPE = "snapshot"


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
    task: TaskState = TaskState.IMAGE_SNAPSHOT,
    vm_states: tuple[VmState, ...] = SNAPSHOTTABLE,
    backup_rotation: int | None = None,
) -> tuple[Instance, Image] | None:
    """Start the snapshot: the task (``task``: a shelve begins ``shelving``) and the
    ``queued`` image (a backup's with its rotation, :mod:`shared.db.backups`); ``None``
    if the swap was lost (the server is in another state, or has a task: the caller
    answers 409)."""
    instance = await begin_task(conn, instance_uuid, task, vm_states=vm_states)
    if instance is None:
        return None
    image = await images.create(
        conn,
        image_id=image_id,
        name=name,
        disk_format=disk_format,
        container_format="bare",
        min_disk=min_disk,
        min_ram=min_ram,
        owner=owner,
        visibility="private",
        properties=properties,
        status="queued",
        backup_rotation=backup_rotation,
    )
    return instance, image


async def withdraw(conn: Connection, instance_uuid: UUID) -> bool:
    """Undo :func:`begin` while no agent has moved the snapshot on: the task cleared and
    the image killed. Under a delete's mark (it replaced the task) the mark stays and the
    image is killed. False if the task already moved on otherwise."""
    done = await finish_task(conn, instance_uuid, (TaskState.IMAGE_SNAPSHOT,))
    if done is None and not await marked_for_delete(conn, instance_uuid):
        return False
    await kill_unfinished(conn, instance_uuid)
    return True


async def advance(conn: Connection, instance_uuid: UUID, task: TaskState) -> bool:
    """Move the snapshot's task forward to ``task`` (never back); False if the server is
    not in an earlier snapshot task (its snapshot ended, or it is gone)."""
    order = [t.value for t in SNAPSHOT_TASKS]
    earlier = order[: order.index(task.value)]
    for before in earlier:
        transitions.require_task_change(before, task.value, vm_states=transitions.SNAPSHOTTABLE)
    row = await conn.fetchrow(
        """UPDATE instances SET task_state = $2, updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL AND task_state = ANY($3::text[])
        RETURNING uuid""",
        instance_uuid,
        task.value,
        earlier,
    )
    return row is not None


async def end(conn: Connection, instance_uuid: UUID) -> Instance | None:
    """End the snapshot's task (the vm state unchanged); ``None`` if it was not in one."""
    return await finish_task(conn, instance_uuid, SNAPSHOT_TASKS)


async def kill_unfinished(conn: Connection, instance_uuid: UUID) -> list[UUID]:
    """Kill the server's snapshot images that have no data yet (``queued``, ``saving``):
    ``killed`` and deleted. Their ids."""
    rows = await conn.fetch(
        """UPDATE images SET status = 'killed', deleted_at = now(), upload_token = NULL,
                             updated_at = now()
            WHERE deleted_at IS NULL AND status IN ('queued', 'saving')
              AND properties->>'instance_uuid' = $1
        RETURNING id""",
        str(instance_uuid),
    )
    return [row["id"] for row in rows]


async def snapshot_of(conn: Connection, image_id: UUID) -> UUID | None:
    """The server an image is a snapshot of, if it is one."""
    row = await conn.fetchrow(
        """SELECT properties->>'instance_uuid' AS instance_uuid FROM images WHERE id = $1""",
        image_id,
    )
    if row is None or row["instance_uuid"] is None:
        return None
    try:
        return UUID(row["instance_uuid"])
    except ValueError:
        return None


async def kill_abandoned(conn: Connection, older_than: float) -> list[UUID]:
    """Kill the snapshot images older than ``older_than`` seconds that still wait for
    their data while their server is no longer taking a snapshot or shelving (it was
    deleted, reset, or its snapshot ended without a result). Their ids."""
    rows = await conn.fetch(
        """UPDATE images im SET status = 'killed', deleted_at = now(), upload_token = NULL,
                                updated_at = now()
            WHERE im.deleted_at IS NULL AND im.status IN ('queued', 'saving')
              AND im.properties ? 'instance_uuid'
              AND im.created_at < now() - make_interval(secs => $1)
              AND NOT EXISTS (
                    SELECT 1 FROM instances i
                     WHERE i.uuid::text = im.properties->>'instance_uuid'
                       AND i.deleted_at IS NULL AND i.task_state = ANY($2::text[]))
        RETURNING im.id""",
        older_than,
        [task.value for task in (*SNAPSHOT_TASKS, TaskState.SHELVING)],
    )
    return [row["id"] for row in rows]
