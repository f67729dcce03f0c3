"""``/v2.1/os-keel-host-tasks``: drains and evacuations of whole hosts (a keel extension).

Not part of Nova's API: no stock client sends it, and nothing else depends on it. Admins
only (403 for anyone else):

* ``POST`` with ``{"host_task": {"kind": "drain" | "evacuate", "host": HOST,
  "parallel": N, "cold_fallback": BOOL, "deadline": SECONDS}}`` starts a task, as
  ``keel-manage host drain|evacuate`` does (:mod:`shared.host_task_requests`): 202 with
  the new task, or 200 with the running one of the same kind on that host (it is
  resumed, its own settings kept). A drain moves servers live, and cold where
  ``cold_fallback`` allows it (:mod:`services.conductor.host_tasks.movers`). 400 for a
  bad body or a host that is not fenced for an evacuation (the reason ``evacuate``
  gives); 404 for an unknown host; 409 while a
  task of the other kind runs there, or to drain a host that is down;
* ``GET`` lists the running tasks (``?all=true``: ended ones too, the latest 200), each
  with its counts;
* ``GET /{id}`` (its uuid or number) shows one task with its servers (``items``).

The conductors carry tasks out (:mod:`services.conductor.host_tasks`): a client may ask
and go.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Body, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.api.http.auth import AdminContext
from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import BadRequest, ItemNotFound
from shared import host_task_requests
from shared.db import host_tasks
from shared.host_task_requests import TaskRequest
from shared.objects.host_task import HostTask, HostTaskItem, TaskCounts, TaskKind

router = APIRouter(prefix="/v2.1/os-keel-host-tasks")

LIST_LIMIT = 200


class TaskBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["drain", "evacuate"]
    host: str = Field(min_length=1, max_length=255)
    parallel: int = Field(default=host_task_requests.DEFAULT_PARALLEL, ge=1)
    cold_fallback: bool = False
    deadline: float = Field(default=host_task_requests.DEFAULT_DEADLINE, gt=0)


class ItemView(BaseModel):
    server_id: UUID
    name: str
    #: ``pending``, ``moving``, ``moved``, ``failed`` or ``skipped``.
    status: str
    migration_id: UUID | None
    dest: str | None
    message: str | None
    updated_at: datetime


class TaskView(BaseModel):
    id: UUID
    number: int
    kind: str
    host: str
    #: ``running``, ``done`` or ``failed``.
    status: str
    parallel: int
    cold_fallback: bool
    deadline: datetime
    #: Seconds left before the deadline (by the database's clock); negative once past.
    deadline_in: float
    #: While it runs, what it waits for; once ended, its outcome.
    message: str | None
    user_id: str | None
    created_at: datetime
    ended_at: datetime | None
    counts: dict[str, int]
    total: int
    items: list[ItemView] | None = None


def task_view(
    task: HostTask, counts: TaskCounts, items: list[HostTaskItem] | None = None
) -> TaskView:
    return TaskView(
        id=task.uuid,
        number=task.id,
        kind=task.kind,
        host=task.host,
        status=task.status,
        parallel=task.parallel,
        cold_fallback=task.cold_fallback,
        deadline=task.deadline,
        deadline_in=task.deadline_in,
        message=task.message,
        user_id=task.user_id,
        created_at=task.created_at,
        ended_at=task.ended_at,
        counts=counts.model_dump(),
        total=counts.total,
        items=None
        if items is None
        else [
            ItemView(
                server_id=i.instance_uuid,
                name=i.name,
                status=i.status,
                migration_id=i.migration_uuid,
                dest=i.dest,
                message=i.message,
                updated_at=i.updated_at,
            )
            for i in items
        ],
    )


def parse_body(body: Any) -> TaskBody:
    if not isinstance(body, dict) or set(body) != {"host_task"}:
        raise BadRequest('The body must be {"host_task": {"kind": "drain" | "evacuate", ...}}.')
    try:
        return TaskBody.model_validate(body["host_task"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "host_task"
        raise BadRequest(
            f"Invalid input for field/attribute {where}: {first['msg']}"[:300]
        ) from None


@router.post("")
async def start_task(
    pool: DbPool,
    *,
    ctx: AdminContext,
    settings: AppSettings,
    body: Annotated[Any, Body()] = None,
) -> JSONResponse:
    asked = parse_body(body)
    request = TaskRequest(
        kind=TaskKind(asked.kind),
        host=asked.host,
        parallel=asked.parallel,
        cold_fallback=asked.cold_fallback,
        deadline=asked.deadline,
    )
    async with pool.acquire() as conn:
        task, new = await host_task_requests.start(
            conn,
            ctx,
            request,
            down_time=settings.service_down_time,
            margin=settings.fencing.margin,
        )
        counts = (await host_tasks.counts(conn, [task.id]))[task.id]
    view = task_view(task, counts)
    return JSONResponse(
        {"host_task": view.model_dump(mode="json")}, status_code=202 if new else 200
    )


@router.get("")
async def list_tasks(
    pool: DbPool, *, ctx: AdminContext, all: Annotated[bool, Query()] = False
) -> dict[str, list[TaskView]]:
    async with pool.acquire() as conn:
        found = await host_tasks.list_tasks(conn, include_ended=all, limit=LIST_LIMIT)
        counts = await host_tasks.counts(conn, [task.id for task in found])
    return {"host_tasks": [task_view(task, counts[task.id]) for task in found]}


@router.get("/{task_ref}")
async def show_task(task_ref: str, pool: DbPool, *, ctx: AdminContext) -> dict[str, TaskView]:
    async with pool.acquire() as conn:
        task = await host_tasks.find(conn, task_ref[:64])
        if task is None:
            raise ItemNotFound(f"Host task {task_ref[:64]} could not be found.")
        counts = (await host_tasks.counts(conn, [task.id]))[task.id]
        items = await host_tasks.items(conn, task.id)
    return {"host_task": task_view(task, counts, items)}
