"""Moving a server: ``evacuate``, ``migrate``, and the end of a cold migration.

One workflow with two kinds (:data:`~shared.objects.migration.EVACUATION` and
:data:`~shared.objects.migration.MIGRATION`). Admins only. For either kind keel-api

1. checks the body as Nova's schema does, the server's state (no task; ACTIVE, SHUTOFF,
   or for an evacuation also ERROR: 409 otherwise), the RPC caps (a deployment with a
   conductor or compute service too old for the move: 409 naming them, nothing
   written) and the source: an **evacuation** needs the server's host *fenced*
   (:mod:`shared.host_fencing`: forced down, or silent past its fence's lease and the margin;
   400 ``Compute service of <host> is still in use.`` while it is up, and 400 naming
   the seconds left, or what to do, while it is down but not fenced), a **cold
   migration** needs it *up* (409). A named
   ``host`` must be a compute host other than the source; it is a requested
   destination, still checked by every scheduler filter;
2. records the move in one transaction: the task (``rebuilding`` or ``resize_prep``),
   a migration record (``accepted``) and the instance action;
3. casts it to the conductor (:mod:`services.conductor.moves` carries it out) and
   answers 200 (evacuate; with an ``adminPass`` below 2.14) or 202 (migrate).

When the cast cannot be sent, the move is withdrawn — the record ``accepted`` →
``error`` and the task cleared, each a compare-and-swap that succeeds only while no
conductor has acted on the move — and the answer is 503. If a conductor had already
taken it (an earlier attempt reached the broker after all), the answer is the normal
one: the move goes on.

``confirmResize`` (204) and ``revertResize`` (202) need the server VERIFY_RESIZE (vm
state ``resized``, no task) with its migration ``finished``; the record goes to
``confirming`` or ``reverting`` with the task, in one transaction. Confirm removes the
source's copy, so the source's compute service must be up; revert removes the
destination's copy and starts the source's again, so both must be up (409). Once
recorded, a confirm or revert is never undone: if the cast cannot be sent, the
conductors' sweep runs the step once the record has waited long enough (see
:mod:`services.conductor.moves.sweep`), and the answer is the normal one.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Awaitable, Callable
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
from services.api.servers import group_hint, publish
from services.compute.rpcapi import SINCE, ComputeAPI
from services.conductor.live_rpc import LIVE_VERSION
from services.conductor.rpcapi import RESIZE_VERSION, ConductorAPI
from shared import host_fencing
from shared.config import Settings
from shared.context import RequestContext
from shared.db import (
    compute_nodes,
    move_requests,
    moves,
    placement,
    services,
)
from shared.db.errors import is_unavailable
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, MessagingError
from shared.objects.compute_node import HostState
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Instance
from shared.objects.migration import (
    CONFIRM_ACTION,
    EVACUATION,
    LIVE_MIGRATION,
    MIGRATION,
    RESIZE,
    Migration,
    MigrationStatus,
    MoveKind,
)
from shared.objects.service import Binary, Service
from shared.objects.states import VmState
from shared.versions import first_release_speaking, release_name

LOG = logging.getLogger(__name__)

_HOSTNAME = re.compile(r"^[a-zA-Z0-9-._]{1,255}$")

#: The compute RPC method the destination's agent needs for each kind of move.
_COMPUTE_METHOD = {
    EVACUATION: "rebuild_instance",
    MIGRATION: "prepare_migration",
    RESIZE: "prepare_migration",
    LIVE_MIGRATION: "live_migrate",
}
#: The conductor RPC version each kind of move needs.
_CONDUCTOR_VERSION = {
    EVACUATION: "1.4",
    MIGRATION: "1.5",
    RESIZE: RESIZE_VERSION,
    LIVE_MIGRATION: LIVE_VERSION,
}


# --- the bodies --------------------------------------------------------------------


def requested_host(value: dict[str, Any]) -> str | None:
    """The body's ``host``, if any; 400 if it is not a host name."""
    host = value.get("host")
    if host is not None and (not isinstance(host, str) or not _HOSTNAME.match(host)):
        raise BadRequest("Invalid input for field/attribute host: not a host name.")
    return host


def _check_keys(action: str, value: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise BadRequest(
            f"Invalid input for field/attribute {action}: additional properties are not "
            f"allowed ({', '.join(repr(k)[:60] for k in unknown)})."
        )


def evacuation_target(value: Any, version: APIVersion) -> str | None:
    """The requested host of an ``evacuate`` body, checked as Nova's schema does."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute evacuate: it must be an object.")
    allowed = {"host", "adminPass"}
    if not version.at_least("2.14"):
        allowed.add("onSharedStorage")
    if version.at_least("2.29") and not version.at_least("2.68"):
        allowed.add("force")
    _check_keys("evacuate", value, allowed)
    if value.get("force") is True:
        raise BadRequest(
            "Forced evacuation is not supported: keel checks every requested host with its "
            "scheduler filters. Leave out 'force'."
        )
    return requested_host(value)


def migration_target(value: Any, version: APIVersion) -> str | None:
    """The requested host of a ``migrate`` body, checked as Nova's schema does."""
    if value is None or not version.at_least("2.56"):
        # Below 2.56 Nova takes any value and names no host.
        return None
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute migrate: it must be an object.")
    _check_keys("migrate", value, {"host"})
    return requested_host(value)


# --- the checks ----------------------------------------------------------------------


def _check_state(instance: Instance, action: str, vm_states: tuple[VmState, ...]) -> None:
    if instance.task_state is not None:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid} while it is in task_state "
            f"{instance.task_state}"
        )
    if instance.vm_state not in vm_states:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid} while it is in vm_state "
            f"{instance.vm_state}"
        )


async def _check_caps(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    kind: MoveKind,
    action: str,
    instance: Instance,
    down_time: float,
) -> None:
    """409 while an older service or a pin keeps the RPC caps below this kind of move."""
    needed = _CONDUCTOR_VERSION[kind]
    if not await conductor.client.can_send_version(needed):
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()} and {kind.migration_type} needs "
            f"{needed}. Upgrade every keel-conductor (or lift "
            "KEEL_UPGRADE_LEVELS__CONDUCTOR) first."
        )
    method = _COMPUTE_METHOD[kind]
    if await compute.can_send(method):
        return
    since = SINCE[method]
    release = first_release_speaking("compute", since) or 0
    async with pool.acquire() as conn:
        old = await services.older_than(conn, Binary.COMPUTE.value, release, down_time)
    holders = (
        "compute service(s) "
        + ", ".join(f"{s.host} (release {release_name(s.version)})" for s in old)
        + " are too old"
        if old
        else "the compute RPC version is pinned (KEEL_UPGRADE_LEVELS__COMPUTE)"
    )
    raise ConflictingRequest(
        f"Cannot '{action}' instance {instance.uuid}: {holders}; {kind.migration_type} "
        f"needs compute RPC {since} (release {release_name(release)}), and the cap is "
        f"{await compute.client.cap()}. Upgrade those services first."
    )


async def _source(
    pool: asyncpg.Pool, kind: MoveKind, instance: Instance, down_time: float, margin: float
) -> HostState:
    async with pool.acquire() as conn:
        source = await placement.host_of(conn, instance, down_time)
        silent = None if source is None else await host_fencing.silent_for(conn, source.service.id)
    if source is None:
        raise ConflictingRequest(
            f"Cannot '{kind.action}' instance {instance.uuid} while it has no compute host"
        )
    if kind is EVACUATION:
        fenced = host_fencing.fence_state(
            source.service, silent, down_time=down_time, margin=margin
        )
        if not fenced.fenced:
            raise BadRequest(fenced.why)
    if kind is not EVACUATION and not source.service.is_up:
        raise ConflictingRequest(
            f"Cannot '{kind.action}' instance {instance.uuid}: the compute service of its "
            f"host {source.service.host} is down. Evacuate it instead, or start that agent."
        )
    return source


async def _check_target(
    pool: asyncpg.Pool,
    kind: MoveKind,
    *,
    instance: Instance,
    target: str | None,
    source: HostState,
    down_time: float,
) -> None:
    if target is None:
        return
    async with pool.acquire() as conn:
        found = await services.list_services(
            conn, down_time, host=target, binary=Binary.COMPUTE.value
        )
    if kind is EVACUATION:
        if not found:
            raise ItemNotFound(f"Compute host {target} not found.")
        if found[0].id == source.service.id:
            raise BadRequest("The target host can't be the same one.")
    elif not found:
        raise BadRequest(f"Compute host {target} could not be found.")
    elif found[0].id == source.service.id:
        raise BadRequest(
            f"Unable to migrate instance ({instance.uuid}) to current host ({source.service.host})."
        )
    async with pool.acquire() as conn:
        nodes = await compute_nodes.named(conn, host=target, node=None)
        group = await group_hint.group_of(conn, instance.uuid)
        await group_hint.check_destination(
            conn, group, [node.id for node in nodes], moving=instance.uuid
        )


# --- record, cast, withdraw ------------------------------------------------------------


async def start_move(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    kind: MoveKind,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
    target: str | None,
    flavors: tuple[FlavorSnapshot, FlavorSnapshot] | None = None,
    check: Callable[[Connection], Awaitable[None]] | None = None,
    end_stopped: bool = False,
    forced: bool = False,
) -> None:
    """Check, record and cast a move of ``kind``; 503 (withdrawn) if it cannot be cast.

    ``flavors`` and ``check``: a resize's old and new flavor, and its quota check (run in
    the transaction that records the move). ``end_stopped``: an evacuation that ends
    with the server stopped (2.95). ``forced``: a live migration whose host skips the
    scheduler's filters (2.30 to 2.67).
    """
    action = kind.action
    _check_state(instance, action, kind.movable)
    down_time = settings.service_down_time
    await _check_caps(
        pool, conductor, compute, kind=kind, action=action, instance=instance, down_time=down_time
    )
    source = await _source(pool, kind, instance, down_time, settings.fencing.margin)
    await _check_target(
        pool, kind, instance=instance, target=target, source=source, down_time=down_time
    )

    recorded = False

    async def reached_commit(_conn: Connection, _migration: Migration) -> None:
        nonlocal recorded
        recorded = True

    try:
        migration = await move_requests.record(
            pool,
            ctx,
            kind,
            instance_uuid=instance.uuid,
            source=source.node,
            target=target,
            flavors=flavors,
            check=check,
            then=reached_commit,
            end_stopped=end_stopped,
            forced=forced and target is not None,
        )
    except Exception as exc:
        if recorded and is_unavailable(exc):
            # Its commit may have happened: the move would stand, answered 503, until
            # its deadline ended it (an evacuated server then in ERROR).
            why = (
                f"the connection to the database was lost as the {kind.migration_type} was recorded"
            )
            await publish.withdraw_now_or_later(
                pool,
                move_requests.withdrawing_unconfirmed(ctx, kind, instance.uuid, why),
                instance_uuid=instance.uuid,
                request_id=ctx.request_id,
                what=f"withdrawing the unconfirmed {kind.migration_type} of server {instance.uuid}",
            )
        raise
    if migration is None:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: its state changed; try again"
        )
    casts = {
        EVACUATION: conductor.evacuate_instance,
        MIGRATION: conductor.migrate_instance,
        RESIZE: conductor.resize_instance,
        LIVE_MIGRATION: conductor.live.live_migrate_instance,
    }
    cast = casts[kind]
    outcome, error = await move_requests.cast_or_withdraw(pool, ctx, kind, migration, cast)
    if outcome is move_requests.Outcome.WITHDRAWN:
        raise ServiceUnavailable(
            f"The server was not moved: keel-conductor could not be reached "
            f"({error}). Retry once it is available."
        )
    LOG.info(
        "%s %s of server %s from %s accepted%s",
        kind.migration_type,
        migration.uuid,
        instance.uuid,
        source.service.host,
        f" (to {target})" if target else "",
        extra={
            "instance_uuid": str(instance.uuid),
            "decision": f"{kind.migration_type}_accepted",
        },
    )


#: From this microversion an evacuated server ends stopped on its new host.
EVACUATE_STOPPED_VERSION = "2.95"
#: The first release whose conductors stop a server an evacuation asked to end stopped.
EVACUATE_STOPPED_RELEASE = 25


async def _check_conductors_end_stopped(pool: asyncpg.Pool, down_time: float) -> None:
    """400 while an older conductor, which would start the evacuated server, still runs
    (as Nova refuses 2.95 until every compute is new enough)."""
    async with pool.acquire() as conn:
        old = await services.older_than(
            conn, Binary.CONDUCTOR.value, EVACUATE_STOPPED_RELEASE, down_time
        )
    if old:
        raise BadRequest(
            "Starting with microversion 2.95, evacuate API will stop instance on destination. "
            "To evacuate before upgrades are complete please use an older microversion. "
            f"Required release for keel-conductor: {release_name(EVACUATE_STOPPED_RELEASE)}; "
            "still older: "
            + ", ".join(f"{s.host} (release {release_name(s.version)})" for s in old)
        )


async def evacuate(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    instance: Instance,
    value: Any,
) -> Response:
    if not ctx.is_admin:
        raise Forbidden("Policy doesn't allow os_compute_api:os-evacuate to be performed.")
    target = evacuation_target(value, version)
    end_stopped = version.at_least(EVACUATE_STOPPED_VERSION)
    if end_stopped:
        await _check_conductors_end_stopped(pool, settings.service_down_time)
    await start_move(
        pool,
        conductor,
        compute,
        kind=EVACUATION,
        settings=settings,
        ctx=ctx,
        instance=instance,
        target=target,
        end_stopped=end_stopped,
    )
    if version.at_least("2.14"):
        return Response(status_code=200)
    return JSONResponse({"adminPass": secrets.token_urlsafe(9)}, status_code=200)


async def migrate(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    version: APIVersion,
    instance: Instance,
    value: Any,
) -> None:
    if not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow os_compute_api:os-migrate-server:migrate to be performed."
        )
    target = migration_target(value, version)
    await start_move(
        pool,
        conductor,
        compute,
        kind=MIGRATION,
        settings=settings,
        ctx=ctx,
        instance=instance,
        target=target,
    )


# --- confirm and revert ---------------------------------------------------------------


async def _host_up(pool: asyncpg.Pool, node_id: int | None, down_time: float) -> HostState | None:
    if node_id is None:
        return None
    async with pool.acquire() as conn:
        try:
            return await compute_nodes.host_state_by_id(conn, node_id, down_time)
        except ComputeNodeNotFound:
            return None


async def _finished_migration(pool: asyncpg.Pool, instance: Instance, action: str) -> Migration:
    _check_state(instance, action, (VmState.RESIZED,))
    async with pool.acquire() as conn:
        migration = await moves.in_progress(conn, instance.uuid)
    if migration is None or not migration.is_cold or migration.status != MigrationStatus.FINISHED:
        raise BadRequest(f"Instance {instance.uuid} has not been resized.")
    return migration


async def finish_resize(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    settings: Settings,
    ctx: RequestContext,
    instance: Instance,
    value: Any,
    action: str,
) -> None:
    """``confirmResize`` or ``revertResize`` of a finished cold migration.

    Nova takes any value in the body for both actions; so does keel.
    """
    down_time = settings.service_down_time
    migration = await _finished_migration(pool, instance, action)
    await _check_caps(
        pool,
        conductor,
        compute,
        kind=MIGRATION,
        action=action,
        instance=instance,
        down_time=down_time,
    )
    confirming = action == CONFIRM_ACTION
    needed = [migration.source_compute_id] + ([] if confirming else [migration.dest_compute_id])
    for node_id in needed:
        host = await _host_up(pool, node_id, down_time)
        if host is None or not host.service.is_up:
            name = host.service.host if host is not None else f"node {node_id}"
            raise ConflictingRequest(
                f"Cannot '{action}' instance {instance.uuid}: the compute service of "
                f"{name} is down; start its agent and try again."
            )
    recorded = await move_requests.record_end(pool, ctx, migration, confirming=confirming)
    if not recorded:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: its state changed; try again"
        )
    send = conductor.confirm_migration if confirming else conductor.revert_migration
    try:
        await send(ctx, migration.uuid)
    except MessagingError as exc:
        LOG.warning(
            "%s of server %s (migration %s) is recorded but could not be cast (%s): the "
            "conductors' sweep runs it once the record has waited long enough",
            action,
            instance.uuid,
            migration.uuid,
            exc.message,
            extra={"instance_uuid": str(instance.uuid), "migration_uuid": str(migration.uuid)},
        )
        return
    LOG.info(
        "%s of server %s (migration %s) accepted",
        action,
        instance.uuid,
        migration.uuid,
        extra={
            "instance_uuid": str(instance.uuid),
            "decision": f"migration_{'confirming' if confirming else 'reverting'}",
        },
    )


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
