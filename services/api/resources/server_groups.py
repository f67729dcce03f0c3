"""``os-server-groups``: sets of servers placed by a policy relative to each other.

A group has one policy: ``affinity`` or ``anti-affinity``, and from 2.15
``soft-affinity`` or ``soft-anti-affinity``. Below 2.64 it is asked for and shown as a
one-item ``policies`` list (with an empty ``metadata``); from 2.64 as ``policy``, with
``rules`` (``max_server_per_host``, anti-affinity only). ``project_id`` and ``user_id``
are shown from 2.13. A server joins a group when it is created with the scheduler hint
``group`` (:mod:`services.api.servers.group_hint`); ``members`` lists the live ones.

Members see their project's groups; admins too, or every project's with
``all_projects``. Creating one counts against the project's ``server_groups`` quota
(403 beyond it), checked under the project's lock so concurrent creates cannot both
pass. Deleting a group leaves its servers where they are.
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request, Response

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.http.query import boolean, refuse_unknown
from services.api.resources.quotas import check_new_server_group
from shared.context import RequestContext
from shared.db import server_groups
from shared.db.pool import Connection
from shared.exceptions import ServerGroupNotFound
from shared.objects.server_group import (
    ANTI_AFFINITY,
    MAX_SERVER_PER_HOST,
    POLICIES,
    ServerGroup,
)

router = APIRouter(prefix="/v2.1/os-server-groups")

#: The policies before 2.15 (the soft ones came with it).
FIRST_POLICIES = ("affinity", "anti-affinity")
POLICY_VERSION = "2.64"


def _invalid(field: str, why: str) -> BadRequest:
    return BadRequest(f"Invalid input for field/attribute {field}. {why}")


def _name(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 255:
        raise _invalid("name", "It must be a string of 1 to 255 characters.")
    if value != value.strip() or not value.isprintable():
        raise _invalid("name", "It must be printable, with no leading or trailing whitespace.")
    return value


def _allowed_policies(version: APIVersion) -> tuple[str, ...]:
    return POLICIES if version.at_least("2.15") else FIRST_POLICIES


def _policy_before_2_64(body: dict[str, Any], version: APIVersion) -> str:
    policies = body.get("policies")
    if not isinstance(policies, list) or len(policies) != 1:
        raise _invalid("policies", "It must be a list of exactly one policy.")
    [policy] = policies
    if policy not in _allowed_policies(version):
        raise _invalid("policies", f"Value: {policy!r} is not one of {_allowed_policies(version)}.")
    return str(policy)


def _rules(value: Any, policy: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid("rules", "It must be an object.")
    if not value:
        return {}
    if policy != ANTI_AFFINITY:
        raise BadRequest("Only anti-affinity policy supports rules.")
    unknown = sorted(set(value) - {MAX_SERVER_PER_HOST})
    if unknown:
        raise _invalid("rules", f"Additional properties are not allowed ({unknown[0]!r}).")
    raw = value[MAX_SERVER_PER_HOST]
    number = int(raw) if isinstance(raw, str) and raw.isdigit() else raw
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 2**31 - 1:
        raise _invalid("rules/max_server_per_host", f"Value: {raw!r} must be a positive integer.")
    return {MAX_SERVER_PER_HOST: number}


def parse_new_group(payload: Any, version: APIVersion) -> tuple[str, str, dict[str, Any]]:
    """``(name, policy, rules)`` from a create body, as Nova's schema of ``version`` reads it."""
    body = payload.get("server_group") if isinstance(payload, dict) else None
    if not isinstance(body, dict):
        raise _invalid("server_group", "It is required and must be an object.")
    allowed = (
        {"name", "policy", "rules"} if version.at_least(POLICY_VERSION) else {"name", "policies"}
    )
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _invalid("server_group", f"Additional properties are not allowed ({unknown[0]!r}).")
    name = _name(body.get("name"))
    if not version.at_least(POLICY_VERSION):
        return name, _policy_before_2_64(body, version), {}
    policy = body.get("policy")
    if policy not in POLICIES:
        raise _invalid("policy", f"Value: {policy!r} is not one of {POLICIES}.")
    return name, str(policy), _rules(body.get("rules", {}), str(policy))


def group_view(group: ServerGroup, version: APIVersion) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(group.uuid),
        "name": group.name,
        "members": [str(member) for member in group.members],
    }
    if version.at_least(POLICY_VERSION):
        body["policy"] = group.policy
        body["rules"] = dict(group.rules)
    else:
        body["policies"] = [group.policy]
        body["metadata"] = {}
    if version.at_least("2.13"):
        body["project_id"] = group.project_id
        body["user_id"] = group.user_id
    return body


async def find_group(conn: Connection, ctx: RequestContext, group_id: str) -> ServerGroup:
    """The caller's group ``group_id`` (any project's for admins); 404 otherwise."""
    not_found = ItemNotFound(f"Instance group {group_id} could not be found.")
    try:
        group = await server_groups.get(conn, UUID(group_id))
    except (ValueError, ServerGroupNotFound):
        raise not_found from None
    if not ctx.is_admin and group.project_id != ctx.project_id:
        raise not_found
    return group


@router.post("")
async def create_group(
    request: Request, pool: DbPool, ctx: Context, version: Version, settings: AppSettings
) -> dict[str, Any]:
    try:
        payload = await request.json()
    except ValueError:
        raise BadRequest("Malformed request body: it must be a JSON object.") from None
    name, policy, rules = parse_new_group(payload, version)
    project_id = ctx.project_id or ""
    async with pool.acquire() as conn, conn.transaction():
        await check_new_server_group(conn, project_id, settings.quota)
        group = await server_groups.create(
            conn,
            group_uuid=uuid.uuid4(),
            name=name,
            project_id=project_id,
            user_id=ctx.user_id or "",
            policy=policy,
            rules=rules,
        )
    return {"server_group": group_view(group, version)}


@router.get("")
async def list_groups(
    request: Request, pool: DbPool, ctx: Context, version: Version
) -> dict[str, Any]:
    params = request.query_params
    refuse_unknown(params, {"all_projects", "limit", "offset"}, version)
    every = ctx.is_admin and boolean("all_projects", params.get("all_projects", "false"))
    limit, offset = _number(params.get("limit"), "limit"), _number(params.get("offset"), "offset")
    async with pool.acquire() as conn:
        found = await server_groups.list_groups(
            conn, None if every else ctx.project_id or "", limit=limit, offset=offset or 0
        )
    return {"server_groups": [group_view(group, version) for group in found]}


def _number(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise BadRequest(f"Invalid input for query parameters {name}. Value: {value}.")
    return int(value)


@router.get("/{group_id}", dependencies=[NO_QUERY_FROM_2_102])
async def show_group(group_id: str, pool: DbPool, ctx: Context, version: Version) -> dict[str, Any]:
    async with pool.acquire() as conn:
        group = await find_group(conn, ctx, group_id)
    return {"server_group": group_view(group, version)}


@router.delete("/{group_id}", status_code=204, response_class=Response)
async def delete_group(group_id: str, pool: DbPool, ctx: Context) -> Response:
    async with pool.acquire() as conn:
        group = await find_group(conn, ctx, group_id)
        try:
            await server_groups.delete(conn, group.uuid)
        except ServerGroupNotFound:
            raise ItemNotFound(f"Instance group {group_id} could not be found.") from None
    return Response(status_code=204)
