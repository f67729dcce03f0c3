"""Asking for a move: record it, cast it, withdraw it if it cannot be cast.

keel-api (``evacuate``, ``migrate``) and keel-conductor (automatic evacuation of fenced
hosts, :mod:`services.conductor.recovery`) ask for moves the same way:

1. :func:`record` writes, in one transaction, the instance's task (a compare-and-swap
   that succeeds only while the instance has no task and is in one of the kind's
   movable states), the instance action and the migration record (``accepted``). Of two
   requests for one instance at once, one records the move and the other gets ``None``;
2. the move is cast to the conductors (the caller's cast, e.g.
   ``ConductorAPI.evacuate_instance``);
3. if the cast cannot be sent, :func:`withdraw` ends the record ``accepted`` →
   ``error`` and clears the task — a compare-and-swap that succeeds only while no
   conductor has acted on the move — so nothing is left behind that nobody will carry
   out. When a conductor already took it (an earlier attempt reached the broker after
   all), the move goes on; when the database cannot be reached to withdraw it, it
   stands too (the cast may have gone out), and the move deadline ends it if no
   conductor takes it. Either way keel-api answers as for a move sent.

:func:`cast_or_withdraw` does 2 and 3 and says which happened.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg

from shared.context import RequestContext
from shared.db import instance_actions, instances, moves
from shared.db.pool import Connection
from shared.db.transaction import in_transaction, withdrawal
from shared.exceptions import MessagingError
from shared.objects.compute_node import ComputeNode
from shared.objects.flavor import FlavorSnapshot
from shared.objects.migration import (
    CONFIRM_ACTION,
    REVERT_ACTION,
    Migration,
    MigrationStatus,
    MoveKind,
)
from shared.objects.states import TaskState, VmState

LOG = logging.getLogger(__name__)

#: Sends a recorded move to the conductors (``ConductorAPI.evacuate_instance`` ...).
Cast = Callable[[RequestContext, UUID], Awaitable[None]]


class Outcome(enum.Enum):
    #: The broker took the cast.
    SENT = "sent"
    #: The cast failed, but the move stands: a conductor had already taken it, or the
    #: database could not be reached to withdraw it (the cast may have gone out; the
    #: move deadline ends it if no conductor takes it).
    TAKEN = "taken"
    #: The cast failed and the move was withdrawn: nothing will happen.
    WITHDRAWN = "withdrawn"


async def record(
    pool: asyncpg.Pool,
    ctx: RequestContext,
    kind: MoveKind,
    *,
    instance_uuid: UUID,
    source: ComputeNode,
    target: str | None = None,
    flavors: tuple[FlavorSnapshot, FlavorSnapshot] | None = None,
    check: Callable[[Connection], Awaitable[None]] | None = None,
    then: Callable[[Connection, Migration], Awaitable[None]] | None = None,
    end_stopped: bool = False,
    forced: bool = False,
) -> Migration | None:
    """Record a move of ``kind`` of the instance from ``source``; ``None`` if the instance
    has a task or left the kind's movable states meanwhile (nothing written).

    ``flavors``: a resize's old and new flavor. ``check`` runs first in the same
    transaction (a quota check); what it raises refuses the move, nothing written.
    ``then`` runs last in it, with the new record (a host task links its item to the
    move); what it raises refuses the move too. ``end_stopped``: an evacuation that ends
    with the server stopped (compute microversion 2.95). ``forced``: a live migration
    whose named host skips the scheduler's filters.
    """

    async def write(conn: Connection) -> Migration | None:
        if check is not None:
            await check(conn)
        started = await instances.begin_task(
            conn, instance_uuid, kind.choosing, vm_states=kind.movable
        )
        if started is None:
            return None
        await instance_actions.start(conn, ctx, instance_uuid, kind.action)
        old, new = flavors if flavors is not None else (None, None)
        migration = await moves.create(
            conn,
            ctx,
            instance_uuid=instance_uuid,
            migration_type=kind.migration_type,
            status=MigrationStatus.ACCEPTED,
            source=source,
            dest_host=target,
            old_flavor=old,
            new_flavor=new,
            end_stopped=end_stopped,
            forced=forced,
        )
        if then is not None:
            await then(conn, migration)
        return migration

    return await in_transaction(
        pool, write, what=f"recording {kind.migration_type} of {instance_uuid}"
    )


async def record_end(
    pool: asyncpg.Pool, ctx: RequestContext, migration: Migration, *, confirming: bool
) -> bool:
    """Record the confirm (or revert) of a ``finished`` cold migration: the task, the
    record ``confirming`` (``reverting``) and the instance action, in one transaction.
    False if the server or the record moved on meanwhile (nothing written).

    keel-api's ``confirmResize``/``revertResize`` and a drain's confirm record it so; the
    caller then casts ``confirm_migration`` (``revert_migration``), and the conductors'
    sweep runs the step if that cast is lost.
    """
    task = TaskState.RESIZE_CONFIRMING if confirming else TaskState.RESIZE_REVERTING
    status = MigrationStatus.CONFIRMING if confirming else MigrationStatus.REVERTING
    action = CONFIRM_ACTION if confirming else REVERT_ACTION

    async def write(conn: Connection) -> bool:
        started = await instances.begin_task(
            conn, migration.instance_uuid, task, vm_states=(VmState.RESIZED,)
        )
        if started is None:
            return False
        swapped = await moves.swap_status(
            conn, migration.uuid, expected=[MigrationStatus.FINISHED], new=status
        )
        if swapped is None:
            raise _Changed()
        if not confirming:
            # From now on the copy the migration started from is the server's again: the
            # revert removes the destination's.
            await instances.set_copy_token(conn, migration.instance_uuid, swapped.source_token)
        await instance_actions.start(conn, ctx, migration.instance_uuid, action)
        return True

    try:
        return await in_transaction(pool, write, what=f"{action} of {migration.instance_uuid}")
    except _Changed:
        return False


class _Changed(Exception):
    """The migration moved on between the check and the transaction (rolls it back)."""


async def withdraw(
    pool: asyncpg.Pool, ctx: RequestContext, kind: MoveKind, migration: Migration, why: str
) -> bool:
    """Withdraw a move no conductor has taken (its record ``error``, its action, asked
    by ``ctx``'s request, withdrawn); False if one already has, or if the
    database could not be reached to withdraw it (the cast may have gone out: the move
    stands, and the move deadline ends it if no conductor takes it)."""

    async def end(conn: Connection) -> bool:
        return await _end(conn, ctx, kind, migration, why)

    return await withdrawal(pool, end, what=f"withdrawing {kind.migration_type} {migration.uuid}")


def withdrawing_unconfirmed(
    ctx: RequestContext, kind: MoveKind, instance_uuid: UUID, why: str
) -> Callable[[Connection], Awaitable[bool]]:
    """The withdrawal of the move ``ctx``'s request may have recorded for the server when
    :func:`record` lost its answer: that record, if any, is the one written with the
    request's action, in the same transaction (so at the same start time)."""

    async def end(conn: Connection) -> bool:
        row = await conn.fetchrow(
            """SELECT m.* FROM migrations m
                 JOIN instance_actions a
                   ON a.instance_uuid = m.instance_uuid AND a.request_id = $2
                  AND a.start_time = m.created_at
                WHERE m.instance_uuid = $1 AND m.deleted_at IS NULL""",
            instance_uuid,
            ctx.request_id,
        )
        if row is None:
            return False
        return await _end(conn, ctx, kind, Migration.from_row(row), why)

    return end


async def _end(
    conn: Connection, ctx: RequestContext, kind: MoveKind, migration: Migration, why: str
) -> bool:
    ended = await moves.swap_status(
        conn,
        migration.uuid,
        expected=[MigrationStatus.ACCEPTED],
        new=MigrationStatus.ERROR,
        only_untaken=True,
    )
    if ended is None:
        return False
    await instances.finish_task(conn, migration.instance_uuid, (kind.choosing,))
    await instance_actions.withdraw(conn, migration.instance_uuid, ctx.request_id, why)
    return True


async def cast_or_withdraw(
    pool: asyncpg.Pool,
    ctx: RequestContext,
    kind: MoveKind,
    migration: Migration,
    cast: Cast,
) -> tuple[Outcome, str]:
    """Cast the recorded move; withdraw it if that fails. The outcome, and the error."""
    try:
        await cast(ctx, migration.uuid)
    except MessagingError as exc:
        if await withdraw(pool, ctx, kind, migration, exc.message):
            return Outcome.WITHDRAWN, exc.message
        LOG.warning(
            "%s %s of server %s could not be cast (%s), but it could not be withdrawn "
            "either: it stands",
            kind.migration_type,
            migration.uuid,
            migration.instance_uuid,
            exc.message,
            extra={
                "instance_uuid": str(migration.instance_uuid),
                "migration_uuid": str(migration.uuid),
            },
        )
        return Outcome.TAKEN, exc.message
    return Outcome.SENT, ""
