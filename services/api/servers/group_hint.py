"""The scheduler hint ``group``: a new server joins a server group when it is created.

``os:scheduler_hints`` (or ``OS-SCH-HNT:scheduler_hints``) beside ``server`` in the create
body; ``group`` must be the UUID of a group the caller sees (400 otherwise). Every server
of the request joins it in the transaction that records them, after the group's lock,
so the ``server_group_members`` quota holds under concurrent creates (403 beyond it).
The scheduler then honours the group's policy when it places each one, and every later
move of it (:mod:`services.scheduler.filters.server_group`).

A requested destination (2.74 ``host``/``hypervisor_hostname``, the forced zone form, or
a move's ``host``) that the group's hard policy rules out is refused here with the
reason, before anything is recorded; the scheduler checks again, atomically, when it
claims.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from services.api.http.faults import BadRequest, ConflictingRequest
from services.api.resources.quotas import check_group_members
from services.scheduler.rpcapi import SERVER_GROUP_VERSION
from shared.config import QuotaSettings
from shared.context import RequestContext
from shared.db import compute_nodes, server_groups
from shared.db.pool import Connection
from shared.exceptions import ServerGroupNotFound
from shared.objects.server_group import HARD_POLICIES, ServerGroup
from shared.rpc.client import within
from shared.versions import first_release_speaking, release_name


def group_id(hints: dict[str, Any] | None) -> UUID | None:
    """The group a create's scheduler hints name, if any; 400 unless a UUID."""
    if not hints or "group" not in hints:
        return None
    value = hints["group"]
    try:
        return UUID(value) if isinstance(value, str) else UUID(str(value[0]))
    except (ValueError, TypeError, IndexError, KeyError):
        raise BadRequest(
            f"Invalid input for field/attribute group. Value: {value!r}. It is not a 'uuid'."
        ) from None


def check_schedulers(hints: dict[str, Any] | None, scheduler_cap: str) -> None:
    """409 for a ``group`` hint while a scheduler older than server groups runs: it would
    place the server without its group's policy."""
    if group_id(hints) is None or within(SERVER_GROUP_VERSION, scheduler_cap):
        return
    release = first_release_speaking("scheduler", SERVER_GROUP_VERSION)
    raise ConflictingRequest(
        f"Cannot create a server in a server group: the scheduler RPC version is capped at "
        f"{scheduler_cap} and server groups need {SERVER_GROUP_VERSION} (release "
        f"{release_name(release or 0)}). Upgrade every keel-scheduler (or lift "
        "KEEL_UPGRADE_LEVELS__SCHEDULER) first."
    )


async def find(conn: Connection, ctx: RequestContext, wanted: UUID | None) -> ServerGroup | None:
    """The group to join; 400 when it does not exist or is another project's."""
    if wanted is None:
        return None
    try:
        group = await server_groups.get(conn, wanted)
    except ServerGroupNotFound:
        group = None
    if group is None or not (ctx.is_admin or group.project_id == ctx.project_id):
        raise BadRequest(f"Invalid server group: group {wanted} could not be found.")
    return group


async def join(
    conn: Connection,
    group: ServerGroup | None,
    instance_uuids: Sequence[UUID],
    *,
    quota: QuotaSettings,
) -> None:
    """Make the new servers members (inside the transaction that records them)."""
    if group is None or not instance_uuids:
        return
    await server_groups.lock_group(conn, group.uuid)
    current = await server_groups.get(conn, group.uuid)
    await check_group_members(
        conn, current.project_id, quota, len(current.members), len(instance_uuids)
    )
    await server_groups.add_members(conn, current.id, instance_uuids)


async def check_destination(
    conn: Connection,
    group: ServerGroup | None,
    node_ids: Sequence[int],
    *,
    moving: UUID | None = None,
) -> None:
    """400, saying why, when the group's hard policy rules out every requested node."""
    if group is None or group.policy not in HARD_POLICIES:
        return
    placed = await server_groups.members_placed(conn, group, leaving_out=moving)
    reasons = []
    for node_id in node_ids:
        node = await compute_nodes.get_by_id(conn, node_id)
        if node.service_id is None:
            continue
        refusal = placed.refusal(node.host, node.service_id)
        if not refusal:
            return
        reasons.append(refusal)
    if reasons:
        raise BadRequest(f"The requested destination breaks a server group policy: {reasons[0]}.")


async def group_of(conn: Connection, instance_uuid: UUID) -> ServerGroup | None:
    """The group ``instance_uuid`` is in, if any."""
    found = await server_groups.of_instances(conn, [instance_uuid])
    wanted = found.get(instance_uuid)
    return None if wanted is None else await server_groups.get(conn, wanted)
