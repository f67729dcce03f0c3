"""``GET /ops/api/...``: the operator's page's data, as JSON the page polls (admins only).

| route | what it answers |
|---|---|
| ``/ops/api/hosts`` | every compute host: state, scheduling, fencing, release, servers |
| ``/ops/api/hosts/{uuid}/servers`` | the servers of one host (at most :data:`SERVER_LIMIT`) |
| ``/ops/api/versions`` | releases per binary, RPC pins, what an upgrade waits for |
| ``/ops/api/moves`` | moves not yet ended, with their deadlines |
| ``/ops/api/events`` | hosts fenced now, automatic recoveries, the latest evacuations |
| ``/ops/api/host-tasks`` | host tasks (drains, evacuations): running ones with their servers |

Scripts may read them with an admin's ``X-Auth-Token``. Without a credential the answer
is 401, with anyone else's 403, and neither carries any data.
"""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, Request

from services.api.http.deps import AppSettings, DbPool
from services.api.http.faults import BadRequest
from services.api.ops import views
from services.api.ops.session import OperatorCaller
from services.api.ops.versions import VersionsView, versions_view
from services.api.servers.views import server_status
from shared.config import Settings
from shared.db import compute_nodes, fleet, host_tasks, recoveries, services
from shared.db.pool import Connection
from shared.metrics import Metrics
from shared.version_pins import Pins

router = APIRouter(prefix="/ops/api")

#: The most servers one host's list shows, and moves and events one answer holds.
SERVER_LIMIT = 500
MOVE_LIMIT = 200
EVENT_LIMIT = 20
#: The most host tasks one answer holds (running ones first), and servers per task.
TASK_LIMIT = 50
TASK_ITEM_LIMIT = 500


def parse_id(value: str, what: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise BadRequest(f"Invalid {what} id {value[:60]!r}: not a UUID.") from None


def pins_of(request: Request) -> Pins:
    """keel-api's own pins (made in ``main``); a fresh set for an app built without."""
    pins: Pins | None = getattr(request.app.state, "pins", None)
    if pins is None:
        settings = request.app.state.settings
        pins = Pins.build(request.app.state.pool, settings, Metrics())
        request.app.state.pins = pins
    return pins


async def _hosts(conn: Connection, settings: Settings) -> views.HostsView:
    hosts = await recoveries.compute_hosts(conn, settings.service_down_time)
    counts = await fleet.server_counts(conn)
    running = {
        task.service_id: task.id
        for task in await host_tasks.list_tasks(conn, include_ended=False, limit=TASK_LIMIT)
    }
    shown = []
    for host in hosts:
        by_status: dict[str, int] = {}
        for node in host.nodes:
            for state, n in counts.get(node.id, {}).items():
                status = server_status(state)
                by_status[status] = by_status.get(status, 0) + n
        shown.append(views.host_view(host, by_status, settings, running.get(host.service.id)))
    shown.sort(key=lambda view: view.host)
    return views.HostsView(
        hosts=shown,
        service_down_time=settings.service_down_time,
        fencing_margin=settings.fencing.margin,
    )


@router.get("/hosts")
async def hosts(operator: OperatorCaller, pool: DbPool, settings: AppSettings) -> views.HostsView:
    async with pool.acquire() as conn:
        return await _hosts(conn, settings)


@router.get("/hosts/{service_uuid}/servers")
async def host_servers(
    service_uuid: str, operator: OperatorCaller, pool: DbPool, settings: AppSettings
) -> views.HostServersView:
    wanted = parse_id(service_uuid, "host")
    async with pool.acquire() as conn:
        service = await services.get(conn, wanted, settings.service_down_time)
        nodes = await compute_nodes.of_service(conn, service.id)
        found = await fleet.servers_on(conn, [n.id for n in nodes], limit=SERVER_LIMIT + 1)
    return views.HostServersView(
        host=service.host,
        servers=[views.server_view(server) for server in found[:SERVER_LIMIT]],
        truncated=len(found) > SERVER_LIMIT,
    )


@router.get("/versions")
async def versions(
    request: Request, operator: OperatorCaller, pool: DbPool, settings: AppSettings
) -> VersionsView:
    async with pool.acquire() as conn:
        return await versions_view(conn, pins_of(request), settings.service_down_time)


@router.get("/moves")
async def moves(operator: OperatorCaller, pool: DbPool, settings: AppSettings) -> views.MovesView:
    async with pool.acquire() as conn:
        found = await fleet.open_moves(conn, limit=MOVE_LIMIT + 1)
    return views.MovesView(
        moves=[views.move_view(move, settings) for move in found[:MOVE_LIMIT]],
        truncated=len(found) > MOVE_LIMIT,
    )


@router.get("/host-tasks")
async def host_task_progress(operator: OperatorCaller, pool: DbPool) -> views.HostTasksView:
    """Running host tasks with their servers, then the latest ended ones."""
    async with pool.acquire() as conn:
        found = await host_tasks.list_tasks(conn, include_ended=True, limit=TASK_LIMIT)
        found.sort(key=lambda task: (not task.running, -task.id))
        counts = await host_tasks.counts(conn, [task.id for task in found])
        now = await conn.fetchval("SELECT now()")
        shown = []
        for task in found:
            items = await host_tasks.items(conn, task.id) if task.running else []
            age = (now - task.created_at).total_seconds()
            shown.append(views.host_task_view(task, counts[task.id], items[:TASK_ITEM_LIMIT], age))
    return views.HostTasksView(tasks=shown)


@router.get("/events")
async def events(operator: OperatorCaller, pool: DbPool, settings: AppSettings) -> views.EventsView:
    async with pool.acquire() as conn:
        hosts = await _hosts(conn, settings)
        recovered = await fleet.recent_recoveries(conn, limit=EVENT_LIMIT)
        evacuated = await fleet.recent_evacuations(conn, limit=EVENT_LIMIT)
    return views.EventsView(
        fenced=[host.host for host in hosts.hosts if host.fenced],
        recoveries=[views.recovery_view(r) for r in recovered],
        evacuations=[views.move_view(move, settings) for move in evacuated],
        auto_evacuate=settings.recovery.auto_evacuate,
    )
