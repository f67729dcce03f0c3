"""``os-quota-class-sets``: the limits of a quota class (admins only).

``GET /os-quota-class-sets/{class}`` answers the class's limits: what an admin set for
it, else the setting (``KEEL_QUOTA__*``). ``PUT`` sets some of them, whole numbers (or
strings of them) from -1 (unlimited) up. The class ``default`` is the one that counts:
its limits are every project's defaults, where the project has no limit of its own,
and quota checks use them at once on every keel-api (they are in the database). Any
other class name (1 to 255 characters) is stored and shown, and affects nothing, as in
Nova.

The resources shown follow the microversion as in Nova: before 2.50 the network
resources (``fixed_ips``, ``floating_ips``, ``security_groups``,
``security_group_rules``; accepted, stored and without effect) are shown and the server
group resources are not (a ``PUT`` may still set them); 2.50 drops the network
resources and adds the server group ones; 2.57 drops the injected-file resources.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from services.api.http.auth import AdminContext
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import BadRequest
from services.api.http.microversion import APIVersion
from services.api.resources.quota_sets import json_body, parse_limit
from services.api.resources.quotas import class_limits
from shared.db import quotas

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/os-quota-class-sets")

_BASE = ("cores", "instances", "key_pairs", "metadata_items", "ram")
_GROUPS = ("server_group_members", "server_groups")
_INJECTED = ("injected_file_content_bytes", "injected_file_path_bytes", "injected_files")
_NETWORK = ("fixed_ips", "floating_ips", "security_group_rules", "security_groups")


def shown_at(version: APIVersion) -> tuple[str, ...]:
    """The resources a quota class shows at ``version``, alphabetically."""
    if version.at_least("2.57"):
        return tuple(sorted(_BASE + _GROUPS))
    if version.at_least("2.50"):
        return tuple(sorted(_BASE + _GROUPS + _INJECTED))
    return tuple(sorted(_BASE + _INJECTED + _NETWORK))


def settable_at(version: APIVersion) -> tuple[str, ...]:
    """The resources a ``PUT`` may set at ``version``: before 2.50 the server group ones
    too, though they are not shown there."""
    if version.at_least("2.50"):
        return shown_at(version)
    return tuple(sorted(shown_at(version) + _GROUPS))


def class_name_of(class_name: str) -> str:
    if not 1 <= len(class_name) <= 255:
        raise BadRequest("Invalid quota_class_name: it must be 1 to 255 characters.")
    return class_name


def parse_update(body: object, version: APIVersion) -> dict[str, int]:
    """The limits a ``PUT`` body sets; 400 if anything is off."""
    if not isinstance(body, dict) or set(body) != {"quota_class_set"}:
        raise BadRequest('The request body must be {"quota_class_set": {RESOURCE: LIMIT, ...}}.')
    given = body["quota_class_set"]
    if not isinstance(given, dict):
        raise BadRequest("Invalid input for field/attribute quota_class_set: it must be an object.")
    known = settable_at(version)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise BadRequest(
            "Invalid input for field/attribute quota_class_set. Additional properties are "
            f"not allowed ({', '.join(repr(u) for u in unknown)} unexpected). At "
            f"microversion {version} a quota class sets: {', '.join(known)}."
        )
    return {name: parse_limit(name, value) for name, value in given.items()}


def class_set(limits: dict[str, int], version: APIVersion) -> dict[str, int]:
    return {name: limits.get(name, -1) for name in shown_at(version)}


@router.get("/{class_name}", dependencies=[NO_QUERY_FROM_2_102])
async def show(
    class_name: str,
    *,
    ctx: AdminContext,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        limits = await class_limits(conn, class_name, settings.quota)
    return {"quota_class_set": {"id": class_name, **class_set(limits, version)}}


@router.put("/{class_name}")
async def update(
    class_name: str,
    request: Request,
    *,
    ctx: AdminContext,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
) -> dict[str, Any]:
    class_name_of(class_name)
    values = parse_update(await json_body(request), version)
    async with pool.acquire() as conn:
        await quotas.set_class_limits(conn, class_name, values)
        limits = await class_limits(conn, class_name, settings.quota)
    LOG.info("quota class %s set by %s: %s", class_name, ctx.user_id, values)
    return {"quota_class_set": class_set(limits, version)}
