"""Cold migration: ``migrate``, then ``confirmResize`` or ``revertResize``.

* ``migrate`` (admins; ``{"migrate": null}``, or ``{"migrate": {"host": ...}}`` from
  2.56): the server must be ACTIVE or SHUTOFF with no task, and its compute service up
  (409 otherwise). A named host must be a compute host (400 ``Compute host <name> could
  not be found.``) other than the source (400); it is a requested destination, still
  checked by every scheduler filter. In one transaction the task becomes
  ``resize_prep``, a ``migration`` record is written (``accepted``) and the action
  logged; the conductor carries it out. 202.
* ``confirmResize`` (204) and ``revertResize`` (202): the server must be VERIFY_RESIZE
  (vm state ``resized``, no task) with its migration ``finished``; the record goes to
  ``confirming`` or ``reverting`` with the task, in one transaction. Confirm removes
  the copy on the source, so the source's compute service must be up; revert removes the
  copy on the destination and starts the source's again, so both must be up (409).

While the deployment's RPC caps do not reach cold migration (conductor 1.5, compute
1.3: an older service is still registered, or an operator pinned the version), each is
refused with 409 and nothing is recorded.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import asyncpg

from services.api.http.faults import (
    BadRequest,
    ConflictingRequest,
    Forbidden,
    ServiceUnavailable,
)
from services.api.http.microversion import APIVersion
from services.compute.rpcapi import ComputeAPI
from services.conductor.rpcapi import ConductorAPI
from services.conductor.tasks.move import MIGRATION
from shared.config import Settings
from shared.context import RequestContext
from shared.db import compute_nodes, instance_actions, instances, moves, placement, services
from shared.db.pool import Connection
from shared.db.transaction import in_transaction
from shared.exceptions import ComputeNodeNotFound, MessagingError
from shared.objects.compute_node import HostState
from shared.objects.instance import Instance
from shared.objects.migration import Migration, MigrationStatus, MigrationType
from shared.objects.service import Binary
from shared.objects.states import TaskState, VmState
from shared.versions import first_release_speaking, release_name

LOG = logging.getLogger(__name__)

MIGRATABLE = (VmState.ACTIVE, VmState.STOPPED)
CONFIRM = "confirmResize"
REVERT = "revertResize"
_HOSTNAME = re.compile(r"^[a-zA-Z0-9-._]{1,255}$")


def _target(value: Any, version: APIVersion) -> str | None:
    """The requested host, after checking the body as Nova's schema does."""
    if value is None or not version.at_least("2.56"):
        # Below 2.56 Nova takes any value and names no host.
        return None
    if not isinstance(value, dict):
        raise BadRequest("Invalid input for field/attribute migrate: it must be an object.")
    unknown = sorted(set(value) - {"host"})
    if unknown:
        raise BadRequest(
            f"Invalid input for field/attribute migrate: additional properties are not "
            f"allowed ({', '.join(repr(k)[:60] for k in unknown)})."
        )
    host = value.get("host")
    if host is not None and (not isinstance(host, str) or not _HOSTNAME.match(host)):
        raise BadRequest("Invalid input for field/attribute host: not a host name.")
    return host


async def _check_caps(
    pool: asyncpg.Pool,
    conductor: ConductorAPI,
    compute: ComputeAPI,
    *,
    action: str,
    instance: Instance,
    down_time: float,
) -> None:
    """409 while an older service or a pin keeps the RPC caps below cold migration."""
    if not await conductor.can_migrate():
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: the conductor RPC version is "
            f"capped at {await conductor.client.cap()} and cold migration needs 1.5. "
            "Upgrade every keel-conductor (or lift KEEL_UPGRADE_LEVELS__CONDUCTOR) first."
        )
    if await compute.can_send("prepare_migration"):
        return
    release = first_release_speaking("compute", "1.3") or 0
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
        f"Cannot '{action}' instance {instance.uuid}: {holders}; cold migration needs "
        f"compute RPC 1.3 (release {release_name(release)}), and the cap is "
        f"{await compute.client.cap()}. Upgrade those services first."
    )


async def _host_up(pool: asyncpg.Pool, node_id: int | None, down_time: float) -> HostState | None:
    if node_id is None:
        return None
    async with pool.acquire() as conn:
        try:
            return await compute_nodes.host_state_by_id(conn, node_id, down_time)
        except ComputeNodeNotFound:
            return None


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
    target = _target(value, version)
    _check_state(instance, "migrate", MIGRATABLE)
    down_time = settings.service_down_time
    await _check_caps(
        pool, conductor, compute, action="migrate", instance=instance, down_time=down_time
    )
    async with pool.acquire() as conn:
        source = await placement.host_of(conn, instance, down_time)
        found = (
            await services.list_services(conn, down_time, host=target, binary=Binary.COMPUTE.value)
            if target is not None
            else []
        )
    if source is None:
        raise ConflictingRequest(
            f"Cannot 'migrate' instance {instance.uuid} while it has no compute host"
        )
    if not source.service.is_up:
        raise ConflictingRequest(
            f"Cannot 'migrate' instance {instance.uuid}: the compute service of its host "
            f"{source.service.host} is down. Evacuate it instead, or start that agent."
        )
    if target is not None:
        if not found:
            raise BadRequest(f"Compute host {target} could not be found.")
        if found[0].id == source.service.id:
            raise BadRequest(
                f"Unable to migrate instance ({instance.uuid}) to current host "
                f"({source.service.host})."
            )

    async def record(conn: Connection) -> Migration | None:
        started = await instances.begin_task(
            conn, instance.uuid, TaskState.RESIZE_PREP, vm_states=MIGRATABLE
        )
        if started is None:
            return None
        await instance_actions.start(conn, ctx, instance.uuid, MIGRATION.action)
        return await moves.create(
            conn,
            ctx,
            instance_uuid=instance.uuid,
            migration_type=MigrationType.MIGRATION,
            status=MigrationStatus.ACCEPTED,
            source=source.node,
            dest_host=target,
        )

    migration = await in_transaction(pool, record, what=f"recording migration of {instance.uuid}")
    if migration is None:
        raise ConflictingRequest(
            f"Cannot 'migrate' instance {instance.uuid}: its state changed; try again"
        )
    try:
        await conductor.migrate_instance(ctx, migration.uuid)
    except MessagingError as exc:
        await _withdraw(pool, migration, exc.message)
        raise ServiceUnavailable(
            f"The server was not migrated: keel-conductor could not be reached "
            f"({exc.message}). Retry once it is available."
        ) from None
    LOG.info(
        "migration %s of server %s from %s accepted%s",
        migration.uuid,
        instance.uuid,
        source.service.host,
        f" (to {target})" if target else "",
        extra={"instance_uuid": str(instance.uuid), "decision": "migration_accepted"},
    )


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


async def _withdraw(pool: asyncpg.Pool, migration: Migration, why: str) -> None:
    async def withdraw(conn: Connection) -> None:
        await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.ACCEPTED], new=MigrationStatus.ERROR
        )
        await instances.finish_task(conn, migration.instance_uuid, (TaskState.RESIZE_PREP,))
        await instance_actions.finish(conn, migration.instance_uuid, MIGRATION.action, why)

    await in_transaction(pool, withdraw, what=f"withdrawing migration {migration.uuid}")


async def _finished_migration(pool: asyncpg.Pool, instance: Instance, action: str) -> Migration:
    _check_state(instance, action, (VmState.RESIZED,))
    async with pool.acquire() as conn:
        migration = await moves.in_progress(conn, instance.uuid)
    if (
        migration is None
        or migration.migration_type != MigrationType.MIGRATION
        or migration.status != MigrationStatus.FINISHED
    ):
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
    """``confirmResize`` or ``revertResize`` of a finished cold migration."""
    down_time = settings.service_down_time
    migration = await _finished_migration(pool, instance, action)
    await _check_caps(
        pool, conductor, compute, action=action, instance=instance, down_time=down_time
    )
    confirming = action == CONFIRM
    needed = [migration.source_compute_id] + ([] if confirming else [migration.dest_compute_id])
    for node_id in needed:
        host = await _host_up(pool, node_id, down_time)
        if host is None or not host.service.is_up:
            name = host.service.host if host is not None else f"node {node_id}"
            raise ConflictingRequest(
                f"Cannot '{action}' instance {instance.uuid}: the compute service of "
                f"{name} is down; start its agent and try again."
            )
    task = TaskState.RESIZE_CONFIRMING if confirming else TaskState.RESIZE_REVERTING
    status = MigrationStatus.CONFIRMING if confirming else MigrationStatus.REVERTING

    async def record(conn: Connection) -> bool:
        started = await instances.begin_task(
            conn, instance.uuid, task, vm_states=(VmState.RESIZED,)
        )
        if started is None:
            return False
        swapped = await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.FINISHED], new=status
        )
        if swapped is None:
            raise _Changed()
        await instance_actions.start(conn, ctx, instance.uuid, action)
        return True

    try:
        recorded = await in_transaction(pool, record, what=f"{action} of {instance.uuid}")
    except _Changed:
        recorded = False
    if not recorded:
        raise ConflictingRequest(
            f"Cannot '{action}' instance {instance.uuid}: its state changed; try again"
        )
    send = conductor.confirm_migration if confirming else conductor.revert_migration
    try:
        await send(ctx, migration.uuid)
    except MessagingError as exc:
        await _undo_finish(
            pool, migration, task=task, status=status, action=action, why=exc.message
        )
        raise ServiceUnavailable(
            f"The server was not changed: keel-conductor could not be reached "
            f"({exc.message}). Retry once it is available."
        ) from None
    LOG.info(
        "%s of server %s (migration %s) accepted",
        action,
        instance.uuid,
        migration.uuid,
        extra={"instance_uuid": str(instance.uuid), "decision": f"migration_{status}"},
    )


class _Changed(Exception):
    """The migration moved on between the check and the transaction."""


async def _undo_finish(
    pool: asyncpg.Pool,
    migration: Migration,
    *,
    task: TaskState,
    status: MigrationStatus,
    action: str,
    why: str,
) -> None:
    async def undo(conn: Connection) -> None:
        await moves.swap_status(
            conn, migration.uuid, expected=[status], new=MigrationStatus.FINISHED
        )
        await instances.finish_task(conn, migration.instance_uuid, (task,))
        await instance_actions.finish(conn, migration.instance_uuid, action, why)

    await in_transaction(pool, undo, what=f"undoing {action} of {migration.instance_uuid}")
