"""Following the moves a host task started: each item's move, and what it means for it.

For every item ``moving``, the record of its move says:

* **arrived** (an evacuation ``done``, a cold migration ``confirmed``): the item is
  ``moved``, with its destination;
* **finished** (a cold migration awaiting confirm): the task confirms it as its owner
  would (:func:`shared.db.move_requests.record_end`, then the cast; if the cast is lost,
  the conductors' migration sweep runs the confirm once it has waited long enough);
* **stayed** (``error``, ``failed``, ``reverted``): the item is ``failed``, with the
  reason the move's instance action gives;
* ``cancelled`` (the server was deleted during its move): ``skipped``;
* a **live migration** that ended without arriving (``error``, ``failed``, or
  ``cancelled``: aborted, or the server deleted): ``pending`` again, with why; the
  sweep's start moves it cold if the task allows it, or fails it, and skips a server
  that is gone;
* still ``accepted`` after ``stall`` seconds: nobody took the cast (a conductor died
  between recording the move and casting it): cast again; every receiver is idempotent.

Each change is a compare-and-swap on the item's status, so two sweeps that follow one
task at once change each item once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from services.conductor.host_tasks.movers import BY_TYPE, LIVE
from services.conductor.rpcapi import ConductorAPI
from shared.context import RequestContext
from shared.db import host_tasks, move_requests, moves
from shared.db.host_tasks import MoveState
from shared.exceptions import MessagingError
from shared.objects.host_task import HostTask, HostTaskItem, ItemStatus
from shared.objects.migration import MigrationStatus

LOG = logging.getLogger(__name__)

MOVING = [ItemStatus.MOVING]
S = MigrationStatus


@dataclass
class Follower:
    pool: asyncpg.Pool
    conductor: ConductorAPI
    ctx: RequestContext
    #: Seconds a move may stay ``accepted`` before it is cast again.
    stall: float

    async def follow(self, task: HostTask, items: list[HostTaskItem]) -> int:
        """Follow every moving item; how many are still moving."""
        moving = [i for i in items if i.status == ItemStatus.MOVING and i.migration_uuid]
        if not moving:
            return 0
        async with self.pool.acquire() as conn:
            states = await host_tasks.moves_of(
                conn, [i.migration_uuid for i in moving if i.migration_uuid]
            )
        still = 0
        for item in moving:
            assert item.migration_uuid is not None
            state = states.get(item.migration_uuid)
            if state is None or not await self._step(task, item, state):
                still += 1
        return still

    async def _step(self, task: HostTask, item: HostTaskItem, state: MoveState) -> bool:
        """Act on one item's move; True once the item is no longer moving."""
        migration_uuid = item.migration_uuid
        assert migration_uuid is not None
        mover = BY_TYPE.get(state.migration_type)
        if mover is None:
            return False
        if state.status in mover.arrived:
            return await self._end(item, ItemStatus.MOVED, state.dest, f"moved by {mover.name}")
        if mover is LIVE and (state.status in mover.stayed or state.status == S.CANCELLED):
            # The sweep's start decides what comes next (a cold migration, if the task
            # allows one); a server deleted meanwhile is skipped by its reconcile.
            why = state.message or f"it ended {state.status}"
            return await self._end(
                item, ItemStatus.PENDING, None, f"its live migration did not arrive ({why})"
            )
        if state.status == MigrationStatus.CANCELLED:
            return await self._end(item, ItemStatus.SKIPPED, None, "deleted during its move")
        if state.status in mover.stayed:
            why = state.message or f"its {mover.name} ended {state.status}"
            return await self._end(item, ItemStatus.FAILED, None, why)
        if state.status in mover.to_confirm:
            async with self.pool.acquire() as conn:
                migration = await moves.get(conn, migration_uuid)
            if await move_requests.record_end(self.pool, self.ctx, migration, confirming=True):
                LOG.info(
                    "host task %d confirms the %s of server %s to %s",
                    task.id,
                    mover.name,
                    item.instance_uuid,
                    state.dest,
                    extra={"instance_uuid": str(item.instance_uuid)},
                )
                try:
                    await self.conductor.confirm_migration(self.ctx, migration_uuid)
                except MessagingError as exc:
                    LOG.warning(
                        "host task %d: the confirm of migration %s is recorded but could not "
                        "be cast (%s); the conductors' migration sweep runs it",
                        task.id,
                        migration_uuid,
                        exc.message,
                    )
        elif state.status == MigrationStatus.ACCEPTED and state.idle > self.stall:
            LOG.warning(
                "host task %d: the %s %s of server %s was not taken in %.0fs; casting it again",
                task.id,
                mover.name,
                migration_uuid,
                item.instance_uuid,
                state.idle,
                extra={"instance_uuid": str(item.instance_uuid)},
            )
            try:
                await mover.cast(self.conductor)(self.ctx, migration_uuid)
            except MessagingError as exc:
                LOG.warning("host task %d: casting it again failed: %s", task.id, exc.message)
        return False

    async def _end(
        self, item: HostTaskItem, status: ItemStatus, dest: str | None, message: str
    ) -> bool:
        async with self.pool.acquire() as conn:
            await host_tasks.swap_item(
                conn, item.id, expected=MOVING, new=status, dest=dest, message=message
            )
        return True
