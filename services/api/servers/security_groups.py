"""``GET /servers/{id}/os-security-groups``: the security groups a server is in.

keel's guests have no firewall to configure: every project has one group, ``default``,
and every server is in it (servers show ``security_groups: [{"name": "default"}]``).
This route answers that group in the shape Nova proxies from Neutron, so clients that
compare a server's groups with the ones they want (Ansible's ``openstack.cloud.server``
on its second run) find it there. The group's id is derived from the project, so it is
the same on every call and every server of the project.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from services.api.http.auth import Context
from services.api.http.deps import DbPool
from services.api.servers.fields import DEFAULT_SECURITY_GROUP
from services.api.servers.lookup import find_instance

router = APIRouter(prefix="/v2.1/servers")

_GROUP_IDS = uuid.UUID("6b2f3c1e-9d0a-4c55-8a3e-2f1d7c9b0e41")


def default_group_id(project_id: str) -> uuid.UUID:
    """The id of ``project_id``'s default security group: stable, derived from the project."""
    return uuid.uuid5(_GROUP_IDS, f"security-group {project_id} {DEFAULT_SECURITY_GROUP}")


def default_group(project_id: str) -> dict[str, Any]:
    return {
        "id": str(default_group_id(project_id)),
        "name": DEFAULT_SECURITY_GROUP,
        "description": "Default security group",
        "tenant_id": project_id,
        "rules": [],
    }


@router.get("/{server_id}/os-security-groups")
async def list_server_security_groups(server_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    return {"security_groups": [default_group(instance.project_id)]}
