"""os-services (admin): the keel processes, up or down, and what operators change on them.

``GET /os-services`` filters on ``host`` and ``binary`` server-side (the client's
``compute service set`` needs exactly one match). Nova's binary names (``nova-compute``,
``nova-conductor``, ``nova-scheduler``) stand for keel's wherever a binary is named, and
a list filtered by one shows that name.
From microversion 2.53 a compute service is changed with ``PUT /os-services/{uuid}``:
enable, disable with a reason, or force down. Below 2.53 the same path takes an action
instead of a uuid (:mod:`services.api.resources.os_services_legacy`).

``DELETE /os-services/{id}`` (an integer id below 2.53, the UUID from 2.53) removes a
service whose process is stopped, with its compute node when it hosts no servers
(:mod:`shared.db.service_maintenance`); otherwise 409 says why.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal
from uuid import UUID

import asyncpg
from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from services.api.http.auth import AdminContext
from services.api.http.deps import AppSettings, DbPool, Version
from services.api.http.faults import BadRequest, ItemNotFound
from services.api.http.microversion import APIVersion
from services.api.http.query import refuse_unknown
from services.api.resources.os_services_legacy import legacy_update, parse_body
from services.api.servers.moves import refuse_up_with_unconfirmed_evacuations
from services.api.views.os_services import service_view, service_zone
from shared.context import RequestContext
from shared.db import service_maintenance, services
from shared.db.pool import Connection
from shared.exceptions import ServiceNotFound
from shared.host_fencing import fence_note
from shared.objects.service import NOVA_BINARIES, Binary, Service, canonical_binary

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/v2.1/os-services")


async def _with_zones(
    conn: Connection, down_time: float, *, host: str | None = None, binary: str | None = None
) -> tuple[list[Service], dict[int, str]]:
    """The services asked for, and service id → availability zone of its compute node."""
    found = await services.list_with_zones(conn, down_time, host=host, binary=binary)
    return [s for s, _ in found], {s.id: zone for s, zone in found if zone is not None}


@router.get("")
async def list_services(
    request: Request,
    pool: DbPool,
    *,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
    host: Annotated[str | None, Query()] = None,
    binary: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    refuse_unknown(request.query_params, {"host", "binary"}, version)
    down_time = settings.service_down_time
    async with pool.acquire() as conn:
        found, zones = await _with_zones(
            conn, down_time, host=host, binary=None if binary is None else canonical_binary(binary)
        )
    views = [service_view(s, version, service_zone(s, zones)) for s in found]
    for service, view in zip(found, views, strict=True):
        if service.binary == Binary.COMPUTE:
            # The one free-text column ``compute service list --long`` shows.
            note = fence_note(service)
            reason = view["disabled_reason"]
            view["disabled_reason"] = f"{reason}; {note}" if reason else note
    if binary in NOVA_BINARIES:
        # Asked by Nova's name, answered by it: tools match the binary they asked for.
        for view in views:
            view["binary"] = binary
    return {"services": views}


class ServiceUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["enabled", "disabled"] | None = None
    disabled_reason: str | None = Field(default=None, min_length=1, max_length=255)
    forced_down: bool | None = None


def _check_update(update: ServiceUpdate) -> None:
    if update.status is None and update.forced_down is None:
        raise BadRequest(
            "No updates were requested. Fields 'status' or 'forced_down' should be specified."
        )
    if update.disabled_reason is not None and update.status != "disabled":
        raise BadRequest("Specifying 'disabled_reason' is only valid with status 'disabled'.")


def _check_updatable(service: Service) -> None:
    if service.binary != Binary.COMPUTE:
        raise BadRequest(
            f"Updating a {service.binary} service is not supported. "
            f"Only {Binary.COMPUTE} services can be updated."
        )


@router.put("/{service_id}")
async def update_service(
    service_id: str,
    *,
    body: Annotated[dict[str, Any], Body()],
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
) -> dict[str, Any]:
    if not version.at_least("2.53"):
        return await legacy_update(
            service_id,
            body,
            pool=pool,
            ctx=ctx,
            version=version,
            down_time=settings.service_down_time,
        )
    update = parse_body(ServiceUpdate, body)
    try:
        service_uuid = UUID(service_id)
    except ValueError:
        raise BadRequest(f"Invalid uuid {service_id}") from None
    _check_update(update)
    down_time = settings.service_down_time
    updated = await change_service(
        pool,
        ctx,
        service_uuid,
        down_time,
        disabled=None if update.status is None else update.status == "disabled",
        disabled_reason=update.disabled_reason,
        forced_down=update.forced_down,
    )
    async with pool.acquire() as conn:
        _, zones = await _with_zones(conn, down_time, host=updated.host, binary=updated.binary)
    return {"service": service_view(updated, version, service_zone(updated, zones))}


async def change_service(
    pool: asyncpg.Pool,
    ctx: RequestContext,
    service_uuid: UUID,
    down_time: float,
    *,
    disabled: bool | None = None,
    disabled_reason: str | None = None,
    forced_down: bool | None = None,
) -> Service:
    """Enable, disable (with a reason) or force down or up a compute service; logged.

    What ``PUT /os-services/{uuid}`` does, and the operator's page with it: only compute
    services change (400 otherwise), and a host is not forced up while evacuations away
    from it are done but unconfirmed (400). ``ServiceNotFound`` if there is no such service.
    """
    async with pool.acquire() as conn:
        service = await services.get(conn, service_uuid, down_time)
        _check_updatable(service)
        if forced_down is False:
            await refuse_up_with_unconfirmed_evacuations(conn, service)
        updated = await services.update_status(
            conn,
            service_uuid,
            down_time,
            disabled=disabled,
            disabled_reason=disabled_reason,
            forced_down=forced_down,
        )
    LOG.info(
        "service %s (%s on %s) updated by %s: status=%s forced_down=%s reason=%r",
        updated.uuid,
        updated.binary,
        updated.host,
        ctx.user_id,
        "disabled" if updated.disabled else "enabled",
        updated.forced_down,
        updated.disabled_reason,
    )
    return updated


async def _target(
    conn: Connection, service_id: str, version: APIVersion, down_time: float
) -> Service:
    """The service a path names: by UUID from 2.53, by integer id below."""
    if version.at_least("2.53"):
        try:
            return await services.get(conn, UUID(service_id), down_time)
        except ValueError:
            raise BadRequest(f"Invalid uuid {service_id}") from None
    if not (service_id.isascii() and service_id.isdigit()) or len(service_id) > 18:
        raise BadRequest(f"Invalid service id {service_id}")
    return await services.get_by_id(conn, int(service_id), down_time)


@router.delete("/{service_id}", status_code=204, response_class=Response)
async def delete_service(
    service_id: str,
    *,
    pool: DbPool,
    ctx: AdminContext,
    version: Version,
    settings: AppSettings,
) -> Response:
    down_time = settings.service_down_time
    async with pool.acquire() as conn:
        try:
            service = await _target(conn, service_id, version, down_time)
        except ServiceNotFound:
            raise ItemNotFound(f"Service {service_id} not found.") from None
        nodes = await service_maintenance.delete_service(conn, service, down_time)
    LOG.info(
        "service %s (%s on %s) and %d compute node(s) deleted by %s",
        service.uuid,
        service.binary,
        service.host,
        nodes,
        ctx.user_id,
    )
    return Response(status_code=204)
