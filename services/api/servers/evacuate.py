"""``POST /servers/{id}/action {"evacuate": {...}}``: rebuild a server whose host is down.

Admins only. The server must be ACTIVE, SHUTOFF or ERROR with no task (409 otherwise),
and its compute service must be down — forced down, or its heartbeat stale — or the
answer is 400 ``Compute service of <host> is still in use.`` with nothing recorded: a
host that is merely slow must not end up with two copies running. A target ``host`` must
be a compute host (404 otherwise) other than the source (400); it is a requested
destination, still checked by every scheduler filter.

In one transaction the server's task becomes ``rebuilding``, an ``evacuation`` migration
is recorded (``accepted``) and the action is logged; then the conductor is asked to
carry it out. The answer is 200, with an ``adminPass`` below 2.14 as Nova gives.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any

import asyncpg
from fastapi import Response
from fastapi.responses import JSONResponse

from services.api.http.faults import (
    BadRequest,
    ConflictingRequest,
    Forbidden,
    ItemNotFound,
    ServiceUnavailable,
)
from services.api.http.microversion import APIVersion
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import instance_actions, instances, moves, placement, services
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.exceptions import MessagingError
from shared.objects.compute_node import HostState
from shared.objects.instance import Instance
from shared.objects.migration import Migration, MigrationStatus, MigrationType
from shared.objects.service import Binary, Service
from shared.objects.states import TaskState, VmState

LOG = logging.getLogger(__name__)

ACTION = "evacuate"
EVACUABLE = (VmState.ACTIVE, VmState.STOPPED, VmState.ERROR)
_HOSTNAME = re.compile(r"^[a-zA-Z0-9-._]{1,255}$")


def _target(value: Any, version: APIVersion) -> str | None:
    """The requested host, after checking the body as Nova's schema does."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute evacuate: it must be an object.")
    allowed = {"host", "adminPass"}
    if not version.at_least("2.14"):
        allowed.add("onSharedStorage")
    if version.at_least("2.29") and not version.at_least("2.68"):
        allowed.add("force")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise BadRequest(
            f"Invalid input for field/attribute evacuate: additional properties are not "
            f"allowed ({', '.join(repr(k)[:60] for k in unknown)})."
        )
    if value.get("force") is True:
        raise BadRequest(
            "Forced evacuation is not supported: keel checks every requested host with its "
            "scheduler filters. Leave out 'force'."
        )
    host = value.get("host")
    if host is not None and (not isinstance(host, str) or not _HOSTNAME.match(host)):
        raise BadRequest("Invalid input for field/attribute host: not a host name.")
    return host


async def _source(pool: asyncpg.Pool, instance: Instance, down_time: float) -> HostState:
    async with pool.acquire() as conn:
        source = await placement.host_of(conn, instance, down_time)
    if source is None:
        raise ConflictingRequest(
            f"Cannot 'evacuate' instance {instance.uuid} while it is in vm_state "
            f"{instance.vm_state}: it has no compute host"
        )
    if source.service.is_up:
        raise BadRequest(f"Compute service of {source.service.host} is still in use.")
    return source


async def _check_target(
    pool: asyncpg.Pool, target: str | None, source: HostState, down_time: float
) -> None:
    if target is None:
        return
    async with pool.acquire() as conn:
        found = await services.list_services(
            conn, down_time, host=target, binary=Binary.COMPUTE.value
        )
    if not found:
        raise ItemNotFound(f"Compute host {target} not found.")
    if found[0].id == source.service.id:
        raise BadRequest("The target host can't be the same one.")


def _check_state(instance: Instance) -> None:
    if instance.task_state is not None:
        raise ConflictingRequest(
            f"Cannot 'evacuate' instance {instance.uuid} while it is in task_state "
            f"{instance.task_state}"
        )
    if instance.vm_state not in EVACUABLE:
        raise ConflictingRequest(
            f"Cannot 'evacuate' instance {instance.uuid} while it is in vm_state "
            f"{instance.vm_state}"
        )


async def evacuate(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    instance: Instance,
    value: Any,
) -> Response:
    if not ctx.is_admin:
        raise Forbidden("Policy doesn't allow os_compute_api:os-evacuate to be performed.")
    target = _target(value, version)
    _check_state(instance)
    down_time = settings.service_down_time
    source = await _source(pool, instance, down_time)
    await _check_target(pool, target, source, down_time)

    async def record(conn: Connection) -> Migration | None:
        started = await instances.begin_task(
            conn, instance.uuid, TaskState.REBUILDING, vm_states=EVACUABLE
        )
        if started is None:
            return None
        await instance_actions.start(conn, ctx, instance.uuid, ACTION)
        return await moves.create(
            conn,
            ctx,
            instance_uuid=instance.uuid,
            migration_type=MigrationType.EVACUATION,
            status=MigrationStatus.ACCEPTED,
            source=source.node,
            dest_host=target,
        )

    migration = await in_transaction(pool, record, what=f"recording evacuation of {instance.uuid}")
    if migration is None:
        raise ConflictingRequest(
            f"Cannot 'evacuate' instance {instance.uuid}: its state changed; try again"
        )
    try:
        await conductor.evacuate_instance(ctx, migration.uuid)
    except MessagingError as exc:
        await _withdraw(pool, migration, exc.message)
        raise ServiceUnavailable(
            f"The server was not evacuated: keel-conductor could not be reached "
            f"({exc.message}). Retry once it is available."
        ) from None
    LOG.info(
        "evacuation %s of server %s from %s accepted%s",
        migration.uuid,
        instance.uuid,
        source.service.host,
        f" (to {target})" if target else "",
        extra={"instance_uuid": str(instance.uuid), "decision": "evacuation_accepted"},
    )
    if version.at_least("2.14"):
        return Response(status_code=200)
    return JSONResponse({"adminPass": secrets.token_urlsafe(9)}, status_code=200)


async def _withdraw(pool: asyncpg.Pool, migration: Migration, why: str) -> None:
    async def withdraw(conn: Connection) -> None:
        await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.ACCEPTED], new=MigrationStatus.ERROR
        )
        await instances.finish_task(conn, migration.instance_uuid, (TaskState.REBUILDING,))
        await instance_actions.finish(conn, migration.instance_uuid, ACTION, why)

    await in_transaction(pool, withdraw, what=f"withdrawing evacuation {migration.uuid}")


async def refuse_up_with_unconfirmed_evacuations(conn: Connection, service: Service) -> None:
    """400 while evacuations away from this host are done but not confirmed by its agent.

    Its guests were rebuilt elsewhere; until its agent has removed its copies (it does
    at start-up, forced down or not), bringing it back would run two copies.
    """
    pending = await moves.unconfirmed_evacuations(conn, service.id)
    if not pending:
        return
    listing = ", ".join(f"{m.uuid} (server {m.instance_uuid})" for m in pending[:10])
    more = f" and {len(pending) - 10} more" if len(pending) > 10 else ""
    raise BadRequest(
        f"Cannot unset forced_down for compute service on host {service.host}: evacuations "
        f"{listing}{more} are done but not confirmed by it. Start its agent (it may stay "
        "forced down meanwhile) so it removes the evacuated servers' copies and completes "
        "them, then try again."
    )
