"""Evacuations held until their source's guests are known to be off.

An evacuation of a host an operator forced down is accepted at once, and its
destination chosen and claimed, but if the host's last heartbeat said its fence was
armed, the fence may let the old copy run until its lease runs out
(:mod:`shared.host_fencing`). Starting the new copy before then would run two. So the
move task holds it (:func:`hold`): the record stays ``pre-migrating`` with
``held_until`` set to when the lease has certainly run out, and the server's evacuate
action says what it waits for (``openstack server event show``).

Every conductor sends a held evacuation on once ``held_until`` has passed
(:class:`HeldMoves`, every :data:`HELD_INTERVAL` seconds): it casts
``evacuate_instance`` again, and the move task, delivered at least once, checks the
fence afresh (holding again if the source's lease was renewed meanwhile — its agent is
alive) before it asks the destination to build.
A held move is never held past its own deadline (``KEEL_MOVE_TIMEOUT``), which ends it
as it ends any move. Nor past the moment the source's agent, alive again (and renewing
the lease), reports the guest shut down: it keeps the guest of an evacuation under way
off and never starts it, so the move is sent on then (``source_off_at``).
"""

from __future__ import annotations

import logging

import asyncpg

from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import instance_actions
from shared.host_fencing import FenceState
from shared.objects.migration import EVACUATION, Migration

LOG = logging.getLogger(__name__)

#: Seconds between two looks at a held move whose source gave no end to wait for (it
#: came back up, or its lease is being renewed).
RECHECK = 30.0
#: Seconds between two sweeps for held moves whose wait is over (one indexed query).
HELD_INTERVAL = 2.0


async def hold(pool: asyncpg.Pool, migration: Migration, state: FenceState) -> None:
    """Hold ``migration`` until ``state``'s host has certainly powered its guests off."""
    wait = state.seconds_left if state.seconds_left and state.seconds_left > 0 else RECHECK
    why = (
        f"waiting before starting the new copy: {state.why}"
        if state.seconds_left
        else f"waiting before starting the new copy: the guests of {state.host} may run "
        f"({state.why})"
    )
    async with pool.acquire() as conn, conn.transaction():
        first = await conn.fetchval(
            # updated_at stays: the move's own deadline counts from its last real step.
            """UPDATE migrations SET held_until = now() + make_interval(secs => $2)
                WHERE uuid = $1 AND status = 'pre-migrating'
            RETURNING held_until IS NULL""",
            migration.uuid,
            wait,
        )
        if first is None:
            return  # ended meanwhile
        await instance_actions.note(conn, migration.instance_uuid, EVACUATION.action, why)
    LOG.warning(
        "evacuation %s of server %s is held for %.0fs: %s",
        migration.uuid,
        migration.instance_uuid,
        wait,
        state.why,
        extra={
            "instance_uuid": str(migration.instance_uuid),
            "migration_uuid": str(migration.uuid),
            "decision": "evacuation_held",
        },
    )


class HeldMoves:
    """The deadline sweep's part: send held evacuations on once their wait is over."""

    def __init__(self, pool: asyncpg.Pool, conductor: ConductorAPI) -> None:
        self.pool = pool
        self.conductor = conductor

    async def sweep(self) -> int:
        """Cast every held evacuation whose wait is over; how many were sent on."""
        async with self.pool.acquire() as conn:
            due = await conn.fetch(
                """SELECT uuid, instance_uuid, held_until FROM migrations
                    WHERE held_until <= now() AND status = 'pre-migrating'
                      AND deleted_at IS NULL
                    ORDER BY id LIMIT 100"""
            )
        for row in due:
            LOG.info(
                "evacuation %s of server %s waited for its source's fence: sending it on",
                row["uuid"],
                row["instance_uuid"],
                extra={"instance_uuid": str(row["instance_uuid"])},
            )
            await self.conductor.evacuate_instance(RequestContext.internal(), row["uuid"])
            async with self.pool.acquire() as conn:
                # Only the wait just ended: the task may have held it again meanwhile.
                await conn.execute(
                    "UPDATE migrations SET held_until = NULL WHERE uuid = $1 AND held_until = $2",
                    row["uuid"],
                    row["held_until"],
                )
        return len(due)
