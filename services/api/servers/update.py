"""``PUT /servers/{id}``: rename a server, or (from microversion 2.19) describe it.

The answer is Nova's update view below 2.75: the server without its extended attributes
(no ``OS-EXT-*`` keys, key name, security groups or admin fields); from 2.75 the whole
server, as ``GET /servers/{id}`` shows it. The body may also set
``accessIPv4`` / ``accessIPv6`` and, from 2.90, the guest's ``hostname`` (what the
metadata service tells the guest from then on) and, from 2.104, the server's
``pinned_availability_zone`` (:mod:`services.api.servers.pinned_zone`); anything else in
it is a 400.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from services.api.http.auth import Context
from services.api.http.deps import AppSettings, DbPool, RequestLinks, Version
from services.api.http.faults import BadRequest
from services.api.servers.fields import (
    AccessIPv4,
    AccessIPv6,
    Description,
    ServerName,
    unexpected,
)
from services.api.servers.hostname import checked_hostname
from services.api.servers.lookup import find_instance, server_view
from services.api.servers.pinned_zone import checked_zone, repin
from shared.db import server_fields

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/servers")


class ServerUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ServerName | None = None
    description: Description = None
    access_ip_v4: AccessIPv4 = Field(default=None, alias="accessIPv4")
    access_ip_v6: AccessIPv6 = Field(default=None, alias="accessIPv6")
    #: The guest's host name (2.90): see :mod:`services.api.servers.hostname`.
    hostname: Any = None
    #: Unpin or re-pin the server's zone (2.104): see :mod:`services.api.servers.pinned_zone`.
    pinned_availability_zone: Any = None


class ServerUpdateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: ServerUpdate


@router.put("/{server_id}")
async def update_server(
    server_id: str,
    body: ServerUpdateBody,
    *,
    pool: DbPool,
    ctx: Context,
    version: Version,
    links: RequestLinks,
    settings: AppSettings,
) -> dict[str, Any]:
    change = body.server
    describe = "description" in change.model_fields_set
    if describe and not version.at_least("2.19"):
        raise unexpected("description", "2.19")
    if "name" in change.model_fields_set and change.name is None:
        raise BadRequest("Invalid input for field/attribute server.name: it must be a string.")
    hostname = None
    if "hostname" in change.model_fields_set:
        hostname = checked_hostname(change.hostname, version)
    repinning = "pinned_availability_zone" in change.model_fields_set
    zone = checked_zone(change.pinned_availability_zone, version) if repinning else None
    async with pool.acquire() as conn, conn.transaction():
        instance = await find_instance(conn, ctx, server_id)
        if repinning:
            await repin(conn, instance, zone, down_time=settings.service_down_time)
        updated = await server_fields.update(
            conn,
            instance.uuid,
            name=change.name,
            description=change.description,
            set_description=describe,
            access_ip_v4=change.access_ip_v4,
            access_ip_v6=change.access_ip_v6,
            hostname=hostname,
        )
        view = await server_view(
            conn,
            ctx,
            version,
            links,
            settings.service_down_time,
            shown=[updated],
            forward_name=settings.network.forward_name,
        )
    LOG.info(
        "server %s updated: name %r, description %s",
        updated.uuid,
        updated.display_name,
        "changed" if describe else "unchanged",
        extra={"instance_uuid": str(updated.uuid)},
    )
    return {"server": view.changed(updated)}
