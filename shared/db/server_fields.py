"""What users change on a server besides its state: name, description, metadata, tags.

Each change is one ``UPDATE`` of the live instance row, so concurrent changes never
lose one another (metadata is merged and tags appended inside the statement, not read
and written back). Changes that Nova allows only in settled states take ``states``: the
row changes only if its vm state is one of them and no task is running, else
:class:`InstanceInvalidState` says which state it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from shared.db.pool import Connection
from shared.exceptions import InstanceInvalidState, InstanceNotFound
from shared.objects.instance import Instance


def _invalid_state(instance_uuid: UUID, action: str, attr: str, state: str) -> InstanceInvalidState:
    return InstanceInvalidState(
        f"Cannot '{action}' instance {instance_uuid} while it is in {attr} {state}"
    )


async def _update(
    conn: Connection,
    instance_uuid: UUID,
    assignments: str,
    args: Sequence[Any],
    *,
    states: Sequence[str] | None,
    action: str,
    condition: str = "true",
) -> Instance | None:
    """Run ``SET assignments`` on the live row if ``condition`` holds; ``None`` if not.

    ``$1`` is the instance, ``$2`` the allowed states; ``args`` start at ``$3``.
    Raises InstanceNotFound if the row is gone, InstanceInvalidState if its state forbids.
    """
    row = await conn.fetchrow(
        f"""UPDATE instances SET {assignments}, updated_at = now()
             WHERE uuid = $1 AND deleted_at IS NULL
               AND ($2::text[] IS NULL OR (vm_state = ANY($2) AND task_state IS NULL))
               AND ({condition})
            RETURNING *""",
        instance_uuid,
        None if states is None else list(states),
        *args,
    )
    if row is not None:
        return Instance.from_row(row)
    current = await conn.fetchrow(
        "SELECT vm_state, task_state FROM instances WHERE uuid = $1 AND deleted_at IS NULL",
        instance_uuid,
    )
    if current is None:
        raise InstanceNotFound(f"Instance {instance_uuid} could not be found.")
    if states is not None and current["vm_state"] not in states:
        raise _invalid_state(instance_uuid, action, "vm_state", current["vm_state"])
    if states is not None and current["task_state"]:
        raise _invalid_state(instance_uuid, action, "task_state", current["task_state"])
    return None


def _must(instance: Instance | None) -> Instance:
    assert instance is not None  # only None when a condition was given
    return instance


async def record_created(
    conn: Connection,
    instance_uuid: UUID,
    *,
    metadata: dict[str, str],
    description: str | None,
    tags: Sequence[str],
    user_data: str | None,
    access_ip_v4: str | None = None,
    access_ip_v6: str | None = None,
) -> None:
    """Store what a create request says on an instance's row (keel-api's create writes
    them with the row itself: :func:`shared.db.new_servers.insert`)."""
    await conn.execute(
        """UPDATE instances SET metadata = $2, description = $3, tags = $4, user_data = $5,
                  access_ip_v4 = $6, access_ip_v6 = $7
            WHERE uuid = $1""",
        instance_uuid,
        metadata,
        description,
        list(tags),
        user_data,
        access_ip_v4,
        access_ip_v6,
    )


async def update(
    conn: Connection,
    instance_uuid: UUID,
    *,
    name: str | None = None,
    description: str | None = None,
    set_description: bool = False,
    access_ip_v4: str | None = None,
    access_ip_v6: str | None = None,
    hostname: str | None = None,
) -> Instance:
    """Rename, describe (``set_description`` to change the description), set the access
    addresses and/or the host name (each changed only when given)."""
    instance = await _update(
        conn,
        instance_uuid,
        "display_name = COALESCE($3, display_name), "
        "description = CASE WHEN $4 THEN $5 ELSE description END, "
        "access_ip_v4 = COALESCE($6, access_ip_v4), "
        "access_ip_v6 = COALESCE($7, access_ip_v6), "
        "hostname = COALESCE($8, hostname)",
        [name, set_description, description, access_ip_v4, access_ip_v6, hostname],
        states=None,
        action="update",
    )
    return _must(instance)


async def replace_metadata(
    conn: Connection, instance_uuid: UUID, metadata: dict[str, str], *, states: Sequence[str]
) -> Instance:
    instance = await _update(
        conn, instance_uuid, "metadata = $3", [metadata], states=states, action="update metadata"
    )
    return _must(instance)


async def merge_metadata(
    conn: Connection, instance_uuid: UUID, metadata: dict[str, str], *, states: Sequence[str]
) -> Instance:
    """Add or change the given items, keeping the others."""
    instance = await _update(
        conn,
        instance_uuid,
        "metadata = metadata || $3::jsonb",
        [metadata],
        states=states,
        action="update metadata",
    )
    return _must(instance)


async def delete_metadata_item(
    conn: Connection, instance_uuid: UUID, key: str, *, states: Sequence[str]
) -> bool:
    """Remove one item; False if the server has no such key."""
    instance = await _update(
        conn,
        instance_uuid,
        "metadata = metadata - $3::text",
        [key],
        states=states,
        action="delete metadata",
        condition="metadata ? $3::text",
    )
    return instance is not None


async def replace_tags(
    conn: Connection, instance_uuid: UUID, tags: Sequence[str], *, states: Sequence[str]
) -> Instance:
    instance = await _update(
        conn, instance_uuid, "tags = $3", [list(tags)], states=states, action="update tags"
    )
    return _must(instance)


async def add_tag(
    conn: Connection, instance_uuid: UUID, tag: str, *, limit: int, states: Sequence[str]
) -> Instance | None:
    """Add ``tag`` unless present or the server already has ``limit`` tags; None if not added."""
    return await _update(
        conn,
        instance_uuid,
        "tags = array_append(tags, $3::text)",
        [tag, limit],
        states=states,
        action="update tag",
        condition="NOT ($3::text = ANY(tags)) AND cardinality(tags) < $4::int",
    )


async def remove_tag(
    conn: Connection, instance_uuid: UUID, tag: str, *, states: Sequence[str]
) -> bool:
    """Remove ``tag``; False if the server does not have it."""
    instance = await _update(
        conn,
        instance_uuid,
        "tags = array_remove(tags, $3::text)",
        [tag],
        states=states,
        action="delete tag",
        condition="$3::text = ANY(tags)",
    )
    return instance is not None
