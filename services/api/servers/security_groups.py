"""A server's security groups: ``GET /servers/{id}/os-security-groups`` and the
``addSecurityGroup`` / ``removeSecurityGroup`` actions.

keel filters no traffic (its guests have no firewall): a server's groups are recorded
and shown (here, in its view's ``security_groups`` and in the Networking API), nothing
more. A server is in its project's ``default`` group unless its create named other
groups or it was taken out of it. The actions name the group by name (or id), as
Nova's: an unknown group is a 404, adding a group the server is already in or removing
one it is not in a 400, and each answers 202. Each is one statement that changes
nothing when repeated, so of two identical requests at once one changes the server and
the other is told it already had (or had not) the group.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from fastapi import APIRouter

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool
from services.api.http.faults import BadRequest, ConflictingRequest, ItemNotFound
from services.api.servers.lookup import find_instance
from shared.context import RequestContext
from shared.db import security_groups
from shared.db.pool import Connection
from shared.db.security_groups import GroupNameRefused, SecurityGroup
from shared.db.transaction import in_transaction
from shared.objects.instance import Instance

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/servers")

ADD = "addSecurityGroup"
REMOVE = "removeSecurityGroup"


def group_body(group: SecurityGroup) -> dict[str, Any]:
    """The group as the compute API proxies it (the Networking API shows the same one)."""
    return {
        "id": str(group.id),
        "name": group.name,
        "description": group.description,
        "tenant_id": group.project_id,
        "rules": [],
    }


def default_group(project_id: str) -> dict[str, Any]:
    return group_body(security_groups.default_group(project_id))


@router.get("/{server_id}/os-security-groups", dependencies=[NO_QUERY_FROM_2_102])
async def list_server_security_groups(server_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
        found = await security_groups.of_instances(conn, {instance.uuid: instance.project_id})
    return {"security_groups": [group_body(group) for group in found[instance.uuid]]}


def group_name(action: str, value: Any) -> str:
    """The ``name`` of an ``addSecurityGroup``/``removeSecurityGroup`` body, checked."""
    if not isinstance(value, dict):
        raise BadRequest(f"Invalid input for {action}: it must be an object with a 'name'.")
    if "name" not in value:
        raise BadRequest("Missing parameter name")
    name = value["name"]
    if not isinstance(name, str):
        raise BadRequest("Security group name must be a string.")
    name = name.strip()
    if not name:
        raise BadRequest("Security group name cannot be empty")
    return name


async def change_groups(
    pool: asyncpg.Pool, *, ctx: RequestContext, instance: Instance, action: str, value: Any
) -> None:
    """Put the server in the named group (``ADD``) or take it out (``REMOVE``)."""
    name = group_name(action, value)

    async def change(conn: Connection) -> bool:
        try:
            group = await security_groups.find(conn, instance.project_id, name)
        except GroupNameRefused as exc:
            raise ConflictingRequest(exc.message) from None
        if group is None:
            raise ItemNotFound(
                f"Security group {name} not found for project {instance.project_id}."
            )
        if action == ADD:
            return await security_groups.add(conn, instance.uuid, group)
        return await security_groups.remove(conn, instance.uuid, group)

    changed = await in_transaction(pool, change, what=f"{action} {name} on {instance.uuid}")
    if not changed:
        if action == ADD:
            raise BadRequest(
                f"Security group {name} is already associated with the instance {instance.uuid}"
            )
        raise BadRequest(f"Security group {name} not associated with the instance {instance.uuid}")
    LOG.info(
        "server %s %s security group %s",
        instance.uuid,
        "joined" if action == ADD else "left",
        name,
        extra={"decision": "security_group_changed"},
    )
