"""``POST /os-server-external-events``: other services telling the compute API of changes
to servers (Nova's API for Neutron, Cinder, Ironic and Cyborg).

Admins, or users with the ``service`` role (Nova's default), send a list of events, each
``{"name", "server_uuid"[, "status"][, "tag"]}``; the names accepted follow the
microversion as in Nova: ``network-changed``, ``network-vif-plugged``,
``network-vif-unplugged``, ``network-vif-deleted``, and ``volume-extended`` from 2.51,
``power-update`` from 2.76, ``accelerator-request-bound`` from 2.82, ``volume-reimaged``
from 2.93. A malformed body, or a name not accepted at the microversion, is a 400 and
nothing is recorded. Each event is then answered on its own, as Nova answers it:

* ``code`` 404 (``failed``): no such server (or it was deleted);
* ``code`` 400 (``failed``): ``volume-extended``, ``power-update`` and
  ``accelerator-request-bound`` need a ``tag`` (the volume, the power state, the
  request), and it is missing;
* ``code`` 422 (``failed``): the server has no host yet, so there is nowhere to deliver it;
* ``code`` 200 (``completed``): accepted, and recorded on the server as an instance action
  named after the event, finished at once (``Error`` when the sender said ``failed``),
  its message saying what keel did with it.

The answer is 200 when every event was accepted, 207 when any was not (Nova's; Nova
answered 404 when none was, until it called that a bug and dropped it).

What keel does with them: nothing beyond the record. keel has no Neutron (its one
network and fixed addresses are its own, so the ``network-*`` events change nothing),
no volumes (``volume-extended``, ``volume-reimaged``), no bare-metal driver whose power
Ironic changes behind its back (``power-update``: the agents' own power sync tells keel
of power changes) and no accelerators (``accelerator-request-bound``). A sender's retry
is recorded again: each delivery is one record, and none changes a server.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.api.http.auth import Context
from services.api.http.deps import DbPool, Version
from services.api.http.faults import BadRequest, Forbidden
from services.api.http.microversion import APIVersion
from services.api.resources.quota_sets import json_body
from shared.context import RequestContext
from shared.db import instance_actions, instances
from shared.db.pool import Connection
from shared.db.transaction import in_transaction

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/os-server-external-events")

POLICY = "os_compute_api:os-server-external-events:create"
#: Event names, each with the microversion that added it.
EVENTS: dict[str, str] = {
    "network-changed": "2.1",
    "network-vif-plugged": "2.1",
    "network-vif-unplugged": "2.1",
    "network-vif-deleted": "2.1",
    "volume-extended": "2.51",
    "power-update": "2.76",
    "accelerator-request-bound": "2.82",
    "volume-reimaged": "2.93",
}
TAG_REQUIRED = frozenset({"volume-extended", "power-update", "accelerator-request-bound"})
STATUSES = ("failed", "completed", "in-progress")
#: What keel does with each event: why it changes nothing.
WHAT_KEEL_DOES: dict[str, str] = {
    "network-changed": "keel manages its own network: nothing to refresh",
    "network-vif-plugged": "keel manages its own network: no port to wait for",
    "network-vif-unplugged": "keel manages its own network: no port to wait for",
    "network-vif-deleted": "keel manages its own network: no port to detach",
    "volume-extended": "keel has no volumes: nothing to resize",
    "power-update": "keel has no bare-metal driver: the agents report power themselves",
    "accelerator-request-bound": "keel has no accelerators: nothing to bind",
    "volume-reimaged": "keel has no volumes: nothing to rebuild",
}


def may_send(ctx: RequestContext) -> None:
    if not (ctx.is_admin or "service" in ctx.roles):
        raise Forbidden(f"Policy doesn't allow {POLICY} to be performed.")


def names_at(version: APIVersion) -> list[str]:
    return [name for name, since in EVENTS.items() if version.at_least(since)]


def _event(item: object, index: int, version: APIVersion) -> dict[str, Any]:
    where = f"events[{index}]"
    if not isinstance(item, dict):
        raise BadRequest(f"Invalid input for field/attribute {where}: it must be an object.")
    unknown = sorted(set(item) - {"name", "server_uuid", "status", "tag"})
    if unknown:
        raise BadRequest(
            f"Invalid input for field/attribute {where}. Additional properties are not "
            f"allowed ({', '.join(repr(u) for u in unknown)} unexpected)."
        )
    for field in ("name", "server_uuid"):
        if field not in item:
            raise BadRequest(f"Invalid input for field/attribute {where}: '{field}' is required.")
    allowed = names_at(version)
    if item["name"] not in allowed:
        raise BadRequest(
            f"Invalid input for field/attribute name. Value: {str(item['name'])[:60]}. At "
            f"microversion {version} it is one of {allowed}."
        )
    try:
        UUID(str(item["server_uuid"]))
        if not isinstance(item["server_uuid"], str):
            raise ValueError
    except ValueError:
        raise BadRequest(
            f"Invalid input for field/attribute server_uuid. Value: "
            f"{str(item['server_uuid'])[:60]}. It is not a UUID."
        ) from None
    if "status" in item and item["status"] not in STATUSES:
        raise BadRequest(
            f"Invalid input for field/attribute status. Value: {str(item['status'])[:60]}. "
            f"It is one of {list(STATUSES)}."
        )
    tag = item.get("tag")
    if "tag" in item and not (isinstance(tag, str) and len(tag) <= 255):
        raise BadRequest(
            "Invalid input for field/attribute tag: a string of at most 255 characters."
        )
    return dict(item)


def parse_events(body: object, version: APIVersion) -> list[dict[str, Any]]:
    if not isinstance(body, dict) or set(body) != {"events"}:
        raise BadRequest('The request body must be {"events": [EVENT, ...]}.')
    events = body["events"]
    if not isinstance(events, list) or not events:
        raise BadRequest("Invalid input for field/attribute events: a list of one event or more.")
    return [_event(item, index, version) for index, item in enumerate(events)]


async def _answer(conn: Connection, ctx: RequestContext, event: dict[str, Any]) -> dict[str, Any]:
    """The event as answered (``code`` and ``status`` set), recorded when accepted."""
    answered = dict(event)
    server = UUID(event["server_uuid"])
    instance = await instances.find(conn, server)
    if instance is None or instance.deleted_at is not None:
        code = 404
    elif event["name"] in TAG_REQUIRED and event.get("tag") is None:
        code = 400
    elif instance.host is None:
        code = 422
    else:
        code = 200
    answered["code"] = code
    answered["status"] = "completed" if code == 200 else "failed"
    if instance is None or code != 200:
        LOG.info("event %s for server %s dropped (%d)", event["name"], server, code)
        return answered
    did = WHAT_KEEL_DOES[event["name"]]
    tag = f" (tag {event['tag']})" if event.get("tag") is not None else ""
    message = f"{event.get('status', 'completed')}{tag}: {did}"
    await instance_actions.start(conn, ctx, server, event["name"])
    await instance_actions.finish(
        conn, server, event["name"], message, error=event.get("status") == "failed"
    )
    LOG.info(
        "event %s%s for server %s on %s recorded: %s",
        event["name"],
        tag,
        server,
        instance.host,
        did,
        extra={"decision": "external_event_recorded"},
    )
    return answered


@router.post("")
async def create_events(
    request: Request, pool: DbPool, ctx: Context, version: Version
) -> JSONResponse:
    may_send(ctx)
    events = parse_events(await json_body(request), version)

    async def record(conn: Connection) -> list[dict[str, Any]]:
        return [await _answer(conn, ctx, event) for event in events]

    answered = await in_transaction(pool, record, what="recording server external events")
    status = 200 if all(event["code"] == 200 for event in answered) else 207
    return JSONResponse({"events": answered}, status_code=status)
