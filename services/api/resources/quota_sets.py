"""``os-quota-sets``: read and set a project's limits.

``GET /os-quota-sets/{project}`` (admins, or members for their own project) answers
every limit, ``/detail`` each with what is in use, ``/defaults`` the defaults. ``PUT``
(admins) sets limits: whole numbers (or strings of them) ≥ -1, where -1 is unlimited; a
limit below what the project already uses is refused unless ``force`` is true;
``DELETE`` (admins) returns the project to the defaults. The resources shown follow the
microversion as in the compute API: the injected-file limits go at 2.57.

With ``?user_id=USER`` each of these concerns one user's limits within the project, as
in Nova: ``GET`` answers the user's limit where one is set and the project's elsewhere
(``/detail`` counts that user's servers), ``PUT`` sets the user's limits (none above the
project's, none below what the user uses unless ``force``), ``DELETE`` returns the user
to the project's limits. Deleting a project's quotas deletes its users' too.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from services.api.http.auth import AdminContext, Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool, Keystone, Version
from services.api.http.faults import BadRequest, Forbidden
from services.api.http.microversion import APIVersion
from services.api.http.query import refuse_unknown
from services.api.keystone.tokens import KeystoneTokens
from services.api.resources.quotas import default_limits, project_limits, user_limits
from shared.config import Settings
from shared.context import RequestContext
from shared.db import projects, quotas, server_groups
from shared.db.pool import Connection

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/os-quota-sets")

MAX_LIMIT = 2**31 - 1
_INJECTED = ("injected_file_content_bytes", "injected_file_path_bytes", "injected_files")
_ALWAYS = (
    "cores",
    "instances",
    "key_pairs",
    "metadata_items",
    "ram",
    "server_group_members",
    "server_groups",
)
#: Network quotas, shown before 2.36 as unlimited: keel, like Nova with Neutron, has no
#: use for them; a value set for them is accepted and has no effect.
_NETWORK = ("fixed_ips", "floating_ips", "security_group_rules", "security_groups")
#: Resources whose use a new limit may not fall below (without ``force``).
_COUNTED = ("cores", "instances", "ram")


def resources_at(version: APIVersion) -> tuple[str, ...]:
    """The resources the compute API reports at ``version``, alphabetically."""
    names: tuple[str, ...] = _ALWAYS if version.at_least("2.57") else _ALWAYS + _INJECTED
    if not version.at_least("2.36"):
        names += _NETWORK
    return tuple(sorted(names))


def user_of(request: Request, version: APIVersion) -> str | None:
    """The ``user_id`` query parameter: whose limits within the project, if anyone's.

    It is the only parameter these routes take; another is a 400 from 2.75."""
    refuse_unknown(request.query_params, {"user_id"}, version)
    user_id = request.query_params.get("user_id")
    if user_id is None:
        return None
    if not 1 <= len(user_id) <= 255:
        raise BadRequest("Invalid user_id: it must be 1 to 255 characters.")
    return user_id


async def limits_for(
    conn: Connection, settings: Settings, project_id: str, user_id: str | None
) -> dict[str, int]:
    if user_id is None:
        return await project_limits(conn, project_id, settings.quota)
    return await user_limits(conn, project_id, user_id, settings.quota)


async def usage_of(conn: Connection, project_id: str, user_id: str | None) -> dict[str, int]:
    groups = {"server_groups": await server_groups.count(conn, project_id)}
    if user_id is None:
        return {**(await quotas.usage(conn, project_id)).model_dump(), **groups}
    return {**(await quotas.user_usage(conn, project_id, user_id)).model_dump(), **groups}


async def known_project(
    conn: Connection, settings: Settings, project_id: str, keystone: KeystoneTokens | None
) -> None:
    """400 unless ``project_id`` is a project keel knows: a static token's, or one of the
    embedded identity's (behind Keystone: one Keystone knows, or will not say)."""
    static = {info.project_id for info in settings.auth.tokens.values()}
    if project_id in static:
        return
    if keystone is not None:
        known = await keystone.project_known(project_id)
    else:
        known = await projects.exists(conn, project_id)
    if not known:
        raise BadRequest(f"Project ID {project_id} is not a valid project.")


def may_read(ctx: RequestContext, project_id: str) -> None:
    if not ctx.is_admin and project_id != ctx.project_id:
        raise Forbidden(
            "Policy doesn't allow reading another project's quotas: it needs the admin role."
        )


def parse_limit(resource: str, value: object) -> int:
    """A limit as a request gives it: a whole number, or a string of one, -1 to the maximum."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadRequest(
            f"Invalid input for field/attribute {resource}. Value: {value}. "
            "It is not a whole number."
        )
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(
            f"Invalid input for field/attribute {resource}. Value: {value}. "
            "It is not a whole number."
        ) from None
    if not -1 <= number <= MAX_LIMIT:
        raise BadRequest(
            f"Invalid input for field/attribute {resource}. Value: {value}. "
            f"A quota limit is between -1 (unlimited) and {MAX_LIMIT}."
        )
    return number


def _force(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise BadRequest(f"Invalid input for field/attribute force. Value: {value}. Not a boolean.")


async def json_body(request: Request) -> object:
    try:
        return await request.json()
    except ValueError:
        raise BadRequest(
            'Malformed request body: it must be JSON, e.g. {"quota_set": {"instances": 10}}.'
        ) from None


def parse_update(body: object, version: APIVersion) -> tuple[dict[str, int], bool]:
    """The limits a ``PUT`` body sets, and its ``force`` flag; 400 if anything is off."""
    if not isinstance(body, dict) or set(body) != {"quota_set"}:
        raise BadRequest('The request body must be {"quota_set": {RESOURCE: LIMIT, ...}}.')
    given = body["quota_set"]
    if not isinstance(given, dict):
        raise BadRequest("Invalid input for field/attribute quota_set: it must be an object.")
    known = set(resources_at(version))
    unknown = sorted(set(given) - known - {"force"})
    if unknown:
        raise BadRequest(
            "Invalid input for field/attribute quota_set. Additional properties are not "
            f"allowed ({', '.join(repr(u) for u in unknown)} unexpected). At microversion "
            f"{version} the quotas are: {', '.join(sorted(known))}."
        )
    force = _force(given["force"]) if "force" in given else False
    limits = {name: parse_limit(name, value) for name, value in given.items() if name != "force"}
    return limits, force


async def check_not_below_usage(
    conn: Connection, project_id: str, values: dict[str, int], user_id: str | None = None
) -> None:
    usage = await usage_of(conn, project_id, user_id)
    for resource in _COUNTED:
        limit = values.get(resource)
        if limit is not None and limit != -1 and limit < usage[resource]:
            raise BadRequest(
                f"Quota limit {limit} for {resource} must be greater than or equal to "
                f"already used and reserved {usage[resource]}."
            )


def check_within_project(values: dict[str, int], project: dict[str, int]) -> None:
    """A user's limit may not exceed the project's (nor be unlimited in a limited one)."""
    for resource, limit in sorted(values.items()):
        maximum = project.get(resource, -1)
        if maximum != -1 and (limit == -1 or limit > maximum):
            raise BadRequest(
                f"Quota limit {limit} for {resource} must be less than or equal to "
                f"{maximum}, the project's limit."
            )


def quota_set(limits: dict[str, int], version: APIVersion) -> dict[str, Any]:
    return {name: limits.get(name, -1) for name in resources_at(version)}


@router.get("/{project_id}/defaults", dependencies=[NO_QUERY_FROM_2_102])
async def show_defaults(
    project_id: str,
    *,
    ctx: Context,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
    keystone: Keystone,
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        await known_project(conn, settings, project_id, keystone)
        limits = await default_limits(conn, settings.quota)
    return {"quota_set": {"id": project_id, **quota_set(limits, version)}}


@router.get("/{project_id}/detail")
async def show_detail(
    project_id: str,
    request: Request,
    *,
    ctx: Context,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
    keystone: Keystone,
) -> dict[str, Any]:
    user_id = user_of(request, version)
    may_read(ctx, project_id)
    async with pool.acquire() as conn:
        await known_project(conn, settings, project_id, keystone)
        limits = await limits_for(conn, settings, project_id, user_id)
        usage = await usage_of(conn, project_id, user_id)
    detail = {
        name: {"limit": limit, "in_use": usage.get(name, 0), "reserved": 0}
        for name, limit in quota_set(limits, version).items()
    }
    return {"quota_set": {"id": project_id, **detail}}


@router.get("/{project_id}")
async def show(
    project_id: str,
    request: Request,
    *,
    ctx: Context,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
    keystone: Keystone,
) -> dict[str, Any]:
    user_id = user_of(request, version)
    may_read(ctx, project_id)
    async with pool.acquire() as conn:
        await known_project(conn, settings, project_id, keystone)
        limits = await limits_for(conn, settings, project_id, user_id)
    return {"quota_set": {"id": project_id, **quota_set(limits, version)}}


@router.put("/{project_id}")
async def update(
    project_id: str,
    request: Request,
    *,
    ctx: AdminContext,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
    keystone: Keystone,
) -> dict[str, Any]:
    user_id = user_of(request, version)
    values, force = parse_update(await json_body(request), version)
    values = {name: limit for name, limit in values.items() if name not in _NETWORK}
    async with pool.acquire() as conn, conn.transaction():
        await known_project(conn, settings, project_id, keystone)
        await quotas.lock_project(conn, project_id)
        if user_id is not None:
            check_within_project(values, await project_limits(conn, project_id, settings.quota))
        if not force:
            await check_not_below_usage(conn, project_id, values, user_id)
        if user_id is None:
            await quotas.set_limits(conn, project_id, values)
        else:
            await quotas.set_user_limits(conn, project_id, user_id, values)
        limits = await limits_for(conn, settings, project_id, user_id)
    whose = f"project {project_id}" + (f", user {user_id}" if user_id else "")
    LOG.info("quotas of %s set: %s", whose, values)
    return {"quota_set": quota_set(limits, version)}


@router.delete("/{project_id}", status_code=202, response_class=Response)
async def revert(
    project_id: str,
    request: Request,
    *,
    ctx: AdminContext,
    pool: DbPool,
    settings: AppSettings,
    version: Version,
    keystone: Keystone,
) -> Response:
    user_id = user_of(request, version)
    async with pool.acquire() as conn:
        await known_project(conn, settings, project_id, keystone)
        if user_id is None:
            await quotas.clear(conn, project_id)
            LOG.info("quotas of project %s returned to the defaults", project_id)
        else:
            await quotas.clear_user(conn, project_id, user_id)
            LOG.info("quotas of user %s in project %s are the project's again", user_id, project_id)
    return Response(status_code=202)
