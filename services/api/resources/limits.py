"""``GET /limits``: a project's absolute limits and what it uses of them.

The caller's project, or (admins) the one named by ``tenant_id``. keel has no rate
limits, so ``rate`` is empty. The names follow the microversion as in the compute API:
the security-group and floating-IP entries go at 2.36, ``maxImageMeta`` at 2.39 and the
personality ones at 2.57.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import Forbidden
from services.api.http.microversion import APIVersion
from services.api.http.query import refuse_unknown
from services.api.resources.quotas import project_limits
from shared.db import quotas, server_groups
from shared.db.quotas import ProjectUsage

router = APIRouter(prefix="/v2.1/limits")

#: Networking limits reported before 2.36; keel has no networking, so none apply.
_NETWORK = {
    "maxSecurityGroups": -1,
    "maxSecurityGroupRules": -1,
    "maxTotalFloatingIps": -1,
    "totalSecurityGroupsUsed": 0,
    "totalFloatingIpsUsed": 0,
}


def absolute(
    limits: dict[str, int], usage: ProjectUsage, version: APIVersion, groups: int = 0
) -> dict[str, int]:
    body = {
        "maxServerMeta": limits["metadata_items"],
        "maxTotalCores": limits["cores"],
        "maxTotalInstances": limits["instances"],
        "maxTotalKeypairs": limits["key_pairs"],
        "maxTotalRAMSize": limits["ram"],
        "maxServerGroups": limits["server_groups"],
        "maxServerGroupMembers": limits["server_group_members"],
        "totalCoresUsed": usage.cores,
        "totalInstancesUsed": usage.instances,
        "totalRAMUsed": usage.ram,
        "totalServerGroupsUsed": groups,
    }
    if not version.at_least("2.39"):
        body["maxImageMeta"] = limits["metadata_items"]
    if not version.at_least("2.57"):
        body["maxPersonality"] = limits["injected_files"]
        body["maxPersonalitySize"] = limits["injected_file_content_bytes"]
    if not version.at_least("2.36"):
        body.update(_NETWORK)
    return body


@router.get("")
async def show_limits(
    request: Request, ctx: Context, pool: DbPool, settings: AppSettings, version: Version
) -> dict[str, Any]:
    refuse_unknown(request.query_params, {"tenant_id"}, version)
    project_id = request.query_params.get("tenant_id") or ctx.project_id or ""
    if project_id != ctx.project_id and not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow reading another project's limits: it needs the admin role."
        )
    async with pool.acquire() as conn:
        limits = await project_limits(conn, project_id, settings.quota)
        usage = await quotas.usage(conn, project_id)
        groups = await server_groups.count(conn, project_id)
    return {"limits": {"rate": [], "absolute": absolute(limits, usage, version, groups)}}
