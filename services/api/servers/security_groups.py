"""``GET /servers/{id}/os-security-groups``: the security groups a server is in.

keel's guests have no firewall to configure: every project has one group, ``default``,
and every server is in it (servers show ``security_groups: [{"name": "default"}]``).
This route answers that group in the shape Nova proxies from Neutron, so clients that
compare a server's groups with the ones they want (Ansible's ``openstack.cloud.server``
on its second run) find it there. The group's id is derived from the project, so it is
the same on every call and every server of the project, and the Networking API shows
the same group (``/network/v2.0/security-groups``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool
from services.api.network.views import DEFAULT_SECURITY_GROUP, security_group_id
from services.api.servers.lookup import find_instance

router = APIRouter(prefix="/v2.1/servers")


def default_group(project_id: str) -> dict[str, Any]:
    """The group as the compute API proxies it (the Networking API shows the same one)."""
    return {
        "id": str(security_group_id(project_id)),
        "name": DEFAULT_SECURITY_GROUP,
        "description": "Default security group",
        "tenant_id": project_id,
        "rules": [],
    }


@router.get("/{server_id}/os-security-groups", dependencies=[NO_QUERY_FROM_2_102])
async def list_server_security_groups(server_id: str, pool: DbPool, ctx: Context) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    return {"security_groups": [default_group(instance.project_id)]}
