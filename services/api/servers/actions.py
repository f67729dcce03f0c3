"""``POST /servers/{id}/action``: one action per request, named by the body's only key.

The actions keel has are registered in :data:`ACTIONS`; each parses its own value. An
unknown action is a 400, as in Nova.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Body, Response
from fastapi.responses import JSONResponse

from services.api.http.auth import Context
from services.api.http.deps import (
    AppPolicy,
    AppSettings,
    Compute,
    Conductor,
    DbPool,
    RequestLinks,
    Version,
)
from services.api.http.faults import BadRequest
from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.http.policy import Policy
from services.api.servers import (
    backup,
    console,
    inject_network_info,
    live_migration,
    locks,
    rebuild,
    reset_state,
    resize,
    security_groups,
    shelve,
    snapshot,
    soft_delete,
)
from services.api.servers.lookup import find_instance
from services.api.servers.moves import evacuate, finish_resize, migrate
from services.api.servers.power import (
    HARD_REBOOT,
    PAUSE,
    RESUME,
    SOFT_REBOOT,
    START,
    STOP,
    SUSPEND,
    UNPAUSE,
    PowerAction,
    run_power_action,
)
from services.compute.rpcapi import ComputeAPI, RebootType
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.objects.instance import Instance
from shared.objects.migration import CONFIRM_ACTION, REVERT_ACTION

router = APIRouter(prefix="/v2.1/servers")


@dataclass(frozen=True)
class ActionCall:
    """Everything an action handler may need."""

    pool: asyncpg.Pool
    compute: ComputeAPI
    conductor: ConductorAPI
    settings: Settings
    version: APIVersion
    ctx: RequestContext
    instance: Instance
    value: Any
    links: Links
    policy: Policy


#: An action; it answers 202 with no body unless it returns its own response.
Handler = Callable[[ActionCall], Awaitable[Response | None]]


async def _power(
    call: ActionCall, action: PowerAction, reboot: RebootType = RebootType.SOFT
) -> Response | None:
    await run_power_action(
        call.pool,
        call.compute,
        settings=call.settings,
        ctx=call.ctx,
        instance=call.instance,
        action=action,
        reboot_type=reboot,
        conductor=call.conductor,
    )
    return None


async def _stop(call: ActionCall) -> Response | None:
    return await _power(call, STOP)


async def _start(call: ActionCall) -> Response | None:
    return await _power(call, START)


async def _pause(call: ActionCall) -> Response | None:
    return await _power(call, PAUSE)


async def _unpause(call: ActionCall) -> Response | None:
    return await _power(call, UNPAUSE)


async def _suspend(call: ActionCall) -> Response | None:
    return await _power(call, SUSPEND)


async def _resume(call: ActionCall) -> Response | None:
    return await _power(call, RESUME)


def reboot_type(value: Any) -> RebootType:
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind.upper() not in RebootType.__members__:
        raise BadRequest(
            "Invalid input for field/attribute reboot: 'type' is required and must be "
            "'SOFT' or 'HARD'."
        )
    if set(value) - {"type"}:
        raise BadRequest(
            "Invalid input for field/attribute reboot: additional properties are not allowed."
        )
    return RebootType(kind.upper())


async def _reboot(call: ActionCall) -> Response | None:
    kind = reboot_type(call.value)
    return await _power(call, HARD_REBOOT if kind is RebootType.HARD else SOFT_REBOOT, kind)


async def _evacuate(call: ActionCall) -> Response | None:
    return await evacuate(
        call.pool,
        call.conductor,
        call.compute,
        settings=call.settings,
        ctx=call.ctx,
        version=call.version,
        instance=call.instance,
        value=call.value,
    )


async def _resize(call: ActionCall) -> Response | None:
    await resize.resize(
        call.pool,
        call.conductor,
        call.compute,
        settings=call.settings,
        ctx=call.ctx,
        instance=call.instance,
        value=call.value,
    )
    return None


async def _migrate(call: ActionCall) -> Response | None:
    await migrate(
        call.pool,
        call.conductor,
        call.compute,
        settings=call.settings,
        ctx=call.ctx,
        version=call.version,
        instance=call.instance,
        value=call.value,
    )
    return None


async def _live_migrate(call: ActionCall) -> Response | None:
    await live_migration.live_migrate(
        call.pool,
        call.conductor,
        call.compute,
        settings=call.settings,
        ctx=call.ctx,
        version=call.version,
        instance=call.instance,
        value=call.value,
    )
    return None


async def _finish_resize(call: ActionCall, action: str) -> None:
    await finish_resize(
        call.pool,
        call.conductor,
        call.compute,
        settings=call.settings,
        ctx=call.ctx,
        instance=call.instance,
        value=call.value,
        action=action,
    )


async def _confirm_resize(call: ActionCall) -> Response | None:
    await _finish_resize(call, CONFIRM_ACTION)
    return Response(status_code=204)


async def _revert_resize(call: ActionCall) -> Response | None:
    await _finish_resize(call, REVERT_ACTION)
    return None


async def _console_output(call: ActionCall) -> Response | None:
    return await console.console_output(
        call.pool,
        call.compute,
        ctx=call.ctx,
        instance=call.instance,
        value=call.value,
        down_time=call.settings.service_down_time,
    )


async def _rebuild(call: ActionCall) -> Response | None:
    body = await rebuild.rebuild(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        ctx=call.ctx,
        version=call.version,
        links=call.links,
        instance=call.instance,
        value=call.value,
    )
    return JSONResponse(body, status_code=202)


async def _create_backup(call: ActionCall) -> Response | None:
    return await backup.create_backup(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        ctx=call.ctx,
        version=call.version,
        links=call.links,
        instance=call.instance,
        value=call.value,
    )


async def _create_image(call: ActionCall) -> Response | None:
    return await snapshot.create_image(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        ctx=call.ctx,
        version=call.version,
        links=call.links,
        instance=call.instance,
        value=call.value,
    )


async def _reset_state(call: ActionCall) -> Response | None:
    await reset_state.reset_state(call.pool, ctx=call.ctx, instance=call.instance, value=call.value)
    return None


async def _inject_network_info(call: ActionCall) -> Response | None:
    await inject_network_info.inject_network_info(
        call.pool, ctx=call.ctx, instance=call.instance, value=call.value
    )
    return None


async def _lock(call: ActionCall) -> Response | None:
    await locks.lock(
        call.pool, ctx=call.ctx, instance=call.instance, value=call.value, version=call.version
    )
    return None


async def _unlock(call: ActionCall) -> Response | None:
    await locks.unlock(call.pool, ctx=call.ctx, instance=call.instance, value=call.value)
    return None


async def _add_security_group(call: ActionCall) -> Response | None:
    await security_groups.change_groups(
        call.pool,
        ctx=call.ctx,
        instance=call.instance,
        action=security_groups.ADD,
        value=call.value,
    )
    return None


async def _remove_security_group(call: ActionCall) -> Response | None:
    await security_groups.change_groups(
        call.pool,
        ctx=call.ctx,
        instance=call.instance,
        action=security_groups.REMOVE,
        value=call.value,
    )
    return None


async def _restore(call: ActionCall) -> Response | None:
    await soft_delete.restore(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        ctx=call.ctx,
        instance=call.instance,
    )
    return None


async def _force_delete(call: ActionCall) -> Response | None:
    await soft_delete.force_delete(
        call.pool, call.compute, settings=call.settings, ctx=call.ctx, instance=call.instance
    )
    return None


async def _shelve(call: ActionCall) -> Response | None:
    await shelve.shelve(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        ctx=call.ctx,
        instance=call.instance,
        value=call.value,
    )
    return None


async def _shelve_offload(call: ActionCall) -> Response | None:
    await shelve.shelve_offload(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        policy=call.policy,
        ctx=call.ctx,
        instance=call.instance,
        value=call.value,
    )
    return None


async def _unshelve(call: ActionCall) -> Response | None:
    await shelve.unshelve(
        call.pool,
        call.compute,
        call.conductor,
        settings=call.settings,
        policy=call.policy,
        version=call.version,
        ctx=call.ctx,
        instance=call.instance,
        value=call.value,
    )
    return None


#: Action name in the body → its handler.
ACTIONS: dict[str, Handler] = {
    "os-stop": _stop,
    "os-start": _start,
    "pause": _pause,
    "unpause": _unpause,
    "suspend": _suspend,
    "resume": _resume,
    "reboot": _reboot,
    "evacuate": _evacuate,
    "migrate": _migrate,
    live_migration.ACTION: _live_migrate,
    resize.ACTION: _resize,
    CONFIRM_ACTION: _confirm_resize,
    REVERT_ACTION: _revert_resize,
    console.ACTION: _console_output,
    rebuild.ACTION: _rebuild,
    snapshot.ACTION: _create_image,
    backup.ACTION: _create_backup,
    reset_state.ACTION: _reset_state,
    inject_network_info.ACTION: _inject_network_info,
    locks.LOCK: _lock,
    locks.UNLOCK: _unlock,
    soft_delete.RESTORE_ACTION: _restore,
    soft_delete.FORCE_DELETE_ACTION: _force_delete,
    security_groups.ADD: _add_security_group,
    security_groups.REMOVE: _remove_security_group,
    shelve.SHELVE: _shelve,
    shelve.SHELVE_OFFLOAD: _shelve_offload,
    shelve.UNSHELVE: _unshelve,
}
#: Actions a locked server takes from anyone, as in Nova: its security groups change
#: what reaches it, not the server itself.
_UNLOCKED = locks.UNLOCKED_ACTIONS | {security_groups.ADD, security_groups.REMOVE}


@router.post("/{server_id}/action", status_code=202, response_class=Response)
async def server_action(
    server_id: str,
    body: Annotated[dict[str, Any], Body()],
    *,
    pool: DbPool,
    ctx: Context,
    compute: Compute,
    conductor: Conductor,
    settings: AppSettings,
    version: Version,
    links: RequestLinks,
    policy: AppPolicy,
) -> Response:
    if len(body) != 1:
        raise BadRequest("The request body must name exactly one action.")
    ((name, value),) = body.items()
    handler = ACTIONS.get(name)
    if handler is None:
        raise BadRequest(f"There is no such action: {name[:100]}")
    async with pool.acquire() as conn:
        instance = await find_instance(conn, ctx, server_id)
    if name not in _UNLOCKED:
        locks.check_unlocked(ctx, instance)
    answer = await handler(
        ActionCall(pool, compute, conductor, settings, version, ctx, instance, value, links, policy)
    )
    return answer or Response(status_code=202)
