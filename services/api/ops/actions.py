"""``POST /ops/api/...``: what an operator may do from the page, through keel's own paths.

* ``hosts/{uuid}/disable`` with ``{"reason": "..."}`` (required): the scheduler stops
  placing servers there;
* ``hosts/{uuid}/enable``: it places them there again; the reason is cleared;
* ``hosts/{uuid}/force-down``: the operator asserts the host is off, so its servers may
  be evacuated;
* ``hosts/{uuid}/force-up``: refused while evacuations away from it are unconfirmed;
* ``servers/{uuid}/evacuate``: one server rebuilt elsewhere, the scheduler choosing where;
* ``hosts/{uuid}/drain`` with ``{"parallel": N, "cold_fallback": true}``: a host task that
  moves every server off the host (:mod:`shared.host_task_requests`, as ``keel-manage
  host drain`` and ``os-keel-host-tasks`` start it): 202 with the task, or 200 with the
  one already running.

Host changes are those of ``PUT /os-services/{uuid}``
(:func:`~services.api.resources.os_services.change_service`), an evacuation that of
``os-evacuate`` without a host (:func:`~services.api.servers.moves.start_move`): the same
checks (a server's host must be fenced: 400 with the reason otherwise), the same
migration record and instance action, the same answers on failure. The page sends one
request per server, so each server's outcome is shown on its own. With a session, each
request needs the page's CSRF token (:mod:`services.api.ops.session`).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.api.http.deps import AppSettings, Compute, Conductor, DbPool
from services.api.http.faults import BadRequest
from services.api.ops.data import parse_id
from services.api.ops.session import OperatorChange
from services.api.resources.os_services import change_service
from services.api.servers.lookup import find_instance
from services.api.servers.moves import start_move
from shared import host_task_requests
from shared.db import services
from shared.host_task_requests import TaskRequest
from shared.objects.host_task import TaskKind
from shared.objects.migration import EVACUATION
from shared.objects.service import Binary

LOG = logging.getLogger(__name__)

router = APIRouter(prefix="/ops/api")


class DisableBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=255)


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parallel: int = Field(default=host_task_requests.DEFAULT_PARALLEL, ge=1)
    cold_fallback: bool = False
    deadline: float = Field(default=host_task_requests.DEFAULT_DEADLINE, gt=0)


class DrainStarted(BaseModel):
    task: UUID
    number: int
    host: str
    #: False: the drain already running on the host (it goes on as it was started).
    new: bool


class HostChanged(BaseModel):
    host: str
    disabled: bool
    disabled_reason: str | None
    forced_down: bool


class EvacuationAccepted(BaseModel):
    server_id: UUID
    name: str
    source: str | None


def _disable_body(body: Any) -> DisableBody:
    try:
        return DisableBody.model_validate(body)
    except ValidationError:
        raise BadRequest(
            'A host is disabled with a reason: send {"reason": "..."} (1 to 255 characters).'
        ) from None


async def _change(
    pool: DbPool,
    operator: OperatorChange,
    service_uuid: str,
    settings: AppSettings,
    **change: Any,
) -> HostChanged:
    service = await change_service(
        pool,
        operator.ctx,
        parse_id(service_uuid, "host"),
        settings.service_down_time,
        **change,
    )
    return HostChanged(
        host=service.host,
        disabled=service.disabled,
        disabled_reason=service.disabled_reason,
        forced_down=service.forced_down,
    )


@router.post("/hosts/{service_uuid}/disable")
async def disable(
    service_uuid: str,
    operator: OperatorChange,
    pool: DbPool,
    settings: AppSettings,
    body: Annotated[Any, Body()] = None,
) -> HostChanged:
    reason = _disable_body(body).reason
    return await _change(
        pool, operator, service_uuid, settings, disabled=True, disabled_reason=reason
    )


@router.post("/hosts/{service_uuid}/enable")
async def enable(
    service_uuid: str, operator: OperatorChange, pool: DbPool, settings: AppSettings
) -> HostChanged:
    return await _change(pool, operator, service_uuid, settings, disabled=False)


@router.post("/hosts/{service_uuid}/force-down")
async def force_down(
    service_uuid: str, operator: OperatorChange, pool: DbPool, settings: AppSettings
) -> HostChanged:
    return await _change(pool, operator, service_uuid, settings, forced_down=True)


@router.post("/hosts/{service_uuid}/force-up")
async def force_up(
    service_uuid: str, operator: OperatorChange, pool: DbPool, settings: AppSettings
) -> HostChanged:
    return await _change(pool, operator, service_uuid, settings, forced_down=False)


@router.post("/servers/{server_id}/evacuate", status_code=202)
async def evacuate(
    server_id: str,
    *,
    operator: OperatorChange,
    pool: DbPool,
    settings: AppSettings,
    conductor: Conductor,
    compute: Compute,
) -> EvacuationAccepted:
    async with pool.acquire() as conn:
        instance = await find_instance(conn, operator.ctx, server_id)
    await start_move(
        pool,
        conductor,
        compute,
        kind=EVACUATION,
        settings=settings,
        ctx=operator.ctx,
        instance=instance,
        target=None,
    )
    return EvacuationAccepted(
        server_id=instance.uuid, name=instance.display_name, source=instance.host
    )


@router.post("/hosts/{service_uuid}/drain")
async def drain(
    service_uuid: str,
    operator: OperatorChange,
    pool: DbPool,
    settings: AppSettings,
    body: Annotated[Any, Body()] = None,
) -> JSONResponse:
    try:
        asked = DrainBody.model_validate(body or {})
    except ValidationError:
        raise BadRequest(
            'A drain takes {"parallel": N (1 or more), "cold_fallback": true|false, '
            '"deadline": seconds}.'
        ) from None
    async with pool.acquire() as conn:
        service = await services.get(
            conn, parse_id(service_uuid, "host"), settings.service_down_time
        )
        if service.binary != Binary.COMPUTE:
            raise BadRequest(f"Only a compute host is drained; {service.binary} is not one.")
        request = TaskRequest(
            kind=TaskKind.DRAIN,
            host=service.host,
            parallel=asked.parallel,
            cold_fallback=asked.cold_fallback,
            deadline=asked.deadline,
        )
        task, new = await host_task_requests.start(
            conn,
            operator.ctx,
            request,
            down_time=settings.service_down_time,
            margin=settings.fencing.margin,
        )
    started = DrainStarted(task=task.uuid, number=task.id, host=task.host, new=new)
    return JSONResponse(started.model_dump(mode="json"), status_code=202 if new else 200)
