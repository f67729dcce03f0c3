"""A server's actions: ``/servers/{id}/os-instance-actions`` (``openstack server event``).

Every create, delete, stop, start, reboot, evacuate, migrate, confirm and revert is
recorded with who asked (request id, user, project), when it started and finished, and
how it ended. Nova records finer "events" within each action; keel shows each action as
one event named ``compute_<action>`` with the action's result, so clients that read
events (``server event show``) get a faithful summary.

Microversions: from 2.21 the actions of a deleted server are shown too; events are
shown to admins, and from 2.51 to their owners as well (never a traceback: keel keeps
none); from 2.58 actions have ``updated_at`` and the list pages with ``limit``,
``marker`` (a request id) and ``changes-since`` (2.66: ``changes-before``); from 2.62
events carry ``host`` (admins) and ``hostId``; from 2.84 admins see each event's
``details``: why it failed, or null.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request

from services.api.http.auth import Context
from services.api.http.closed_query import NO_QUERY_FROM_2_102
from services.api.http.deps import DbPool, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.http.paging import page_request
from services.api.http.query import refuse_unknown, timestamp
from services.api.servers.views import host_id
from services.api.views.timestamps import naive_isotime
from shared.context import RequestContext
from shared.db import instance_actions, instances
from shared.db.pool import Connection
from shared.exceptions import NotFound
from shared.objects.instance import Instance, InstanceAction

router = APIRouter(prefix="/v2.1/servers")


async def _server(
    conn: Connection, ctx: RequestContext, server_id: str, version: APIVersion
) -> Instance:
    not_found = ItemNotFound(f"Instance {server_id} could not be found.")
    try:
        instance = await instances.find(conn, UUID(server_id))
    except ValueError:
        raise not_found from None
    if instance is None or (instance.deleted_at is not None and not version.at_least("2.21")):
        raise not_found
    if not ctx.is_admin and instance.project_id != ctx.project_id:
        raise not_found
    return instance


def _action(action: InstanceAction, version: APIVersion) -> dict[str, Any]:
    body: dict[str, Any] = {
        "action": action.action,
        "instance_uuid": str(action.instance_uuid),
        "message": action.message,
        "project_id": action.project_id,
        "request_id": action.request_id,
        "start_time": naive_isotime(action.start_time),
        "user_id": action.user_id,
    }
    if version.at_least("2.58"):
        body["updated_at"] = naive_isotime(action.finish_time or action.start_time)
    return body


def _event(
    action: InstanceAction, instance: Instance, ctx: RequestContext, version: APIVersion
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event": f"compute_{action.action}",
        "start_time": naive_isotime(action.start_time),
        "finish_time": naive_isotime(action.finish_time),
        "result": action.result,
    }
    if ctx.is_admin:
        event["traceback"] = None
    if version.at_least("2.62"):
        event["hostId"] = host_id(instance.project_id, instance.host)
        if ctx.is_admin:
            event["host"] = instance.host or ""
    if version.at_least("2.84") and ctx.is_admin:
        # Why the event failed, as the server's fault says it; admins only, since it
        # may name the deployment's insides.
        event["details"] = action.message if action.result == "Error" else None
    return event


@dataclass(frozen=True)
class _Window:
    """Which of a server's actions a list request asks for (from 2.58)."""

    limit: int | None = None
    marker: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def _window(request: Request, version: APIVersion) -> _Window:
    params = request.query_params
    if not version.at_least("2.58"):
        return _Window()
    known = {"limit", "marker", "changes-since"}
    refuse_unknown(
        params,
        known | {"changes-before"} if version.at_least("2.66") else known,
        version,
        since="2.58",
    )
    paging = page_request(params.get("limit"), params.get("marker"))
    since_text = params.get("changes-since")
    until_text = params.get("changes-before") if version.at_least("2.66") else None
    since = timestamp("changes-since", since_text) if since_text else None
    until = timestamp("changes-before", until_text) if until_text else None
    if since is not None and until is not None and since > until:
        raise BadRequest("The value of changes-since must be less than or equal to changes-before.")
    return _Window(limit=paging.limit, marker=paging.marker, since=since, until=until)


@router.get("/{server_id}/os-instance-actions")
async def list_actions(
    server_id: str, request: Request, *, pool: DbPool, ctx: Context, version: Version
) -> dict[str, Any]:
    window = _window(request, version)
    async with pool.acquire() as conn:
        instance = await _server(conn, ctx, server_id, version)
        try:
            found = await instance_actions.list_for(
                conn,
                instance.uuid,
                since=window.since,
                until=window.until,
                marker=window.marker,
                limit=window.limit,
            )
        except NotFound:
            raise BadRequest(f"Marker {window.marker} could not be found.") from None
    return {"instanceActions": [_action(action, version) for action in found]}


@router.get("/{server_id}/os-instance-actions/{request_id}", dependencies=[NO_QUERY_FROM_2_102])
async def show_action(
    server_id: str, request_id: str, *, pool: DbPool, ctx: Context, version: Version
) -> dict[str, Any]:
    async with pool.acquire() as conn:
        instance = await _server(conn, ctx, server_id, version)
        try:
            action = await instance_actions.get(conn, instance.uuid, request_id)
        except NotFound as exc:
            raise ItemNotFound(exc.message) from None
    body = _action(action, version)
    if ctx.is_admin or version.at_least("2.51"):
        body["events"] = [_event(action, instance, ctx, version)]
    return {"instanceAction": body}
