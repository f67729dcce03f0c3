"""Every conductor's sweep over running host tasks: one pass moves each task on.

A pass over a task (taken with a lease, :func:`shared.db.host_tasks.take`, so one
conductor at a time works on it; a conductor killed mid-pass holds it only until the
lease runs out, and every step below is a compare-and-swap anyway):

1. **deadline**: a task past it ends ``failed``; its pending servers fail with "not moved
   before the task's deadline", those moving with what their move is doing (it goes on);
2. **items**: every live server on the host gets an item (servers that arrive later
   too); a pending item whose server left the host otherwise (deleted, moved by someone
   else) is ``skipped``, and one that came back is pending again;
3. **gate** (:mod:`.gates`): a drain disables the host's compute service with a reason
   naming the task, then waits while the host is down; an evacuation waits while the host
   is down but not yet fenced, and ends ``failed`` once it can no longer be fenced (up
   again, or without an armed fence and not forced down);
4. **follow** (:mod:`.follow`): moves under way — arrived, confirmed, failed, lost;
5. **start**: pending servers, oldest first, while fewer than ``parallel`` are moving
   (counted under the task's row lock in the transaction that records each move, so two
   conductors never exceed it): each move recorded as keel-api and the automatic
   evacuation record theirs (:mod:`shared.db.move_requests`) with the item claimed in the
   same transaction, so each server's move is started once, then cast. A server with a
   task waits; a drain chooses each server's move (:func:`.movers.drain_mover`: live
   where it can, cold where the task allows it); one no allowed move can start from
   fails, saying why;
6. **end**: with nothing pending or moving, ``done`` if every server moved, ``failed``
   otherwise, with what is left and why.
"""

from __future__ import annotations

import logging
import uuid

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.host_tasks.follow import Follower
from services.conductor.host_tasks.gates import Gate, gate_for
from services.conductor.host_tasks.movers import EVACUATE, LIVE, Mover, drain_mover
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.context import RequestContext
from shared.db import compute_nodes, host_tasks, move_requests, services
from shared.db.host_tasks import ServerOnHost
from shared.db.pool import Connection
from shared.exceptions import ServiceNotFound
from shared.objects.host_task import HostTask, HostTaskItem, ItemStatus, TaskKind, TaskStatus
from shared.objects.migration import Migration, MigrationType
from shared.objects.states import VmState

LOG = logging.getLogger(__name__)

#: Who a task's moves name when the task's own user is unknown.
HOST_TASK_USER = "keel-host-task"
#: Seconds between two sweeps.
INTERVAL = 1.0
#: Seconds a sweeper holds a task: long enough for any pass.
LEASE = 10.0
#: The most servers an end message names.
NAMED = 10


class _ItemTaken(Exception):
    """The item was claimed by another sweep, or the task is at its parallel bound."""


def task_context(task: HostTask) -> RequestContext:
    """The context of a task's moves: its user, as an admin (their instance actions)."""
    return RequestContext(
        user_id=task.user_id or HOST_TASK_USER, project_id=task.project_id, roles=("admin",)
    )


def listing(items: list[HostTaskItem]) -> str:
    named = "; ".join(
        f"{i.name or i.instance_uuid} ({i.message or i.status})" for i in items[:NAMED]
    )
    more = f"; and {len(items) - NAMED} more" if len(items) > NAMED else ""
    return named + more


class HostTasks:
    """The host task sweep of one conductor (see the module's text)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        conductor: ConductorAPI,
        compute: ComputeAPI,
        settings: Settings,
    ) -> None:
        self.pool = pool
        #: Both with the deployment's RPC caps: whether a drain may move servers live.
        self.conductor = conductor
        self.compute = compute
        self.down_time = settings.service_down_time
        self.margin = settings.fencing.margin
        self.stall = 2 * settings.rpc.call_timeout
        self.sweeper = uuid.uuid4()
        self.interval = INTERVAL

    async def sweep(self) -> int:
        """One pass over every running task; how many it moved on."""
        async with self.pool.acquire() as conn:
            running = await host_tasks.running_ids(conn)
        swept = 0
        for task_id in running:
            async with self.pool.acquire() as conn:
                task = await host_tasks.take(conn, task_id, self.sweeper, LEASE)
            if task is None:
                continue
            try:
                await self.advance(task)
                swept += 1
            finally:
                async with self.pool.acquire() as conn:
                    await host_tasks.release(conn, task_id, self.sweeper)
        return swept

    async def advance(self, task: HostTask) -> None:
        """One pass over ``task``."""
        if task.deadline_in <= 0:
            await self._end_at_deadline(task)
            return
        async with self.pool.acquire() as conn:
            try:
                service = await services.get_by_id(conn, task.service_id, self.down_time)
            except ServiceNotFound:
                await self._end(conn, task, f"the compute service of {task.host} was deleted")
                return
            on_host = {s.uuid: s for s in await host_tasks.servers_on(conn, service.id)}
            await host_tasks.add_items(conn, task.id, list(on_host.values()))
            await self._reconcile(conn, await host_tasks.items(conn, task.id), on_host)
        gate = await gate_for(
            self.pool, task, service, down_time=self.down_time, margin=self.margin
        )
        if gate.refused is not None:
            async with self.pool.acquire() as conn:
                await self._end(conn, task, gate.refused)
            return
        await self._move(task, gate, on_host)

    async def _move(
        self, task: HostTask, gate: Gate, on_host: dict[uuid.UUID, ServerOnHost]
    ) -> None:
        ctx = task_context(task)
        async with self.pool.acquire() as conn:
            items = await host_tasks.items(conn, task.id)
        follower = Follower(self.pool, self.conductor, ctx, self.stall)
        moving = await follower.follow(task, items)
        waiting = gate.waiting
        if waiting is None and moving < task.parallel:
            async with self.pool.acquire() as conn:
                items = await host_tasks.items(conn, task.id)
            waiting = await self._start(task, ctx, items, on_host)
        async with self.pool.acquire() as conn:
            items = await host_tasks.items(conn, task.id)
            if not any(i.status in (ItemStatus.PENDING, ItemStatus.MOVING) for i in items):
                await self._finish(conn, task, items)
            else:
                await host_tasks.note(conn, task.id, waiting)

    async def _reconcile(
        self, conn: Connection, items: list[HostTaskItem], on_host: dict[uuid.UUID, ServerOnHost]
    ) -> None:
        for item in items:
            here = item.instance_uuid in on_host
            if item.status == ItemStatus.PENDING and not here:
                await host_tasks.swap_item(
                    conn,
                    item.id,
                    expected=[ItemStatus.PENDING],
                    new=ItemStatus.SKIPPED,
                    message="no longer on the host (deleted, or moved by someone else)",
                )
            elif item.status in (ItemStatus.SKIPPED, ItemStatus.MOVED) and here:
                await host_tasks.swap_item(
                    conn,
                    item.id,
                    expected=[ItemStatus(item.status)],
                    new=ItemStatus.PENDING,
                    message="back on the host",
                )

    async def _start(
        self,
        task: HostTask,
        ctx: RequestContext,
        items: list[HostTaskItem],
        on_host: dict[uuid.UUID, ServerOnHost],
    ) -> str | None:
        """Start moves of pending servers up to the bound; what the rest waits for."""
        pending = [
            i for i in items if i.status == ItemStatus.PENDING and i.instance_uuid in on_host
        ]
        if not pending:
            return None
        live_failed = await self._live_failures(pending)
        live_possible = await self._live_possible() if task.kind == TaskKind.DRAIN else None
        busy = 0
        for item in pending:
            server = on_host[item.instance_uuid]
            if server.task_state is not None or server.vm_state == VmState.BUILDING:
                busy += 1
                continue
            if task.kind == TaskKind.EVACUATE:
                mover: Mover | None = EVACUATE
                refused = (
                    None
                    if server.vm_state in EVACUATE.kind.movable
                    else f"its vm_state is {server.vm_state}: an evacuation moves only servers "
                    f"in {', '.join(s.value for s in EVACUATE.kind.movable)}"
                )
            else:
                choice = drain_mover(
                    task,
                    server.vm_state,
                    live_possible=live_possible,
                    live_failed=live_failed.get(item.id),
                )
                mover, refused = choice.mover, choice.refused
            if mover is None or refused is not None:
                async with self.pool.acquire() as conn:
                    await host_tasks.swap_item(
                        conn,
                        item.id,
                        expected=[ItemStatus.PENDING],
                        new=ItemStatus.FAILED,
                        message=refused,
                    )
                continue
            if not await self._start_one(task, mover, ctx, item, server):
                break  # at the bound (or another sweep took it): the next pass goes on
        return f"{busy} server(s) wait for their task to end" if busy else None

    async def _live_possible(self) -> str | None:
        """``None`` if every conductor and agent speaks live migration; else why not."""
        if not await self.conductor.live.can_live_migrate():
            return (
                "live migration needs every keel-conductor at release yawl or later (or "
                "KEEL_UPGRADE_LEVELS__CONDUCTOR lifted)"
            )
        if not await self.compute.can_send("live_migrate"):
            return (
                "live migration needs every keel-compute at release yawl or later (or "
                "KEEL_UPGRADE_LEVELS__COMPUTE lifted)"
            )
        return None

    async def _live_failures(self, pending: list[HostTaskItem]) -> dict[int, str]:
        """Pending items whose last move by this task was a live migration that did not
        arrive (failed, aborted): why, by item id."""
        last = {i.id: i.migration_uuid for i in pending if i.migration_uuid is not None}
        if not last:
            return {}
        async with self.pool.acquire() as conn:
            states = await host_tasks.moves_of(conn, list(last.values()))
        failed = {}
        for item_id, migration_uuid in last.items():
            state = states.get(migration_uuid)
            if (
                state is not None
                and state.migration_type == MigrationType.LIVE_MIGRATION.value
                and state.status not in LIVE.arrived
            ):
                why = state.message or f"it ended {state.status}"
                failed[item_id] = f"its live migration {migration_uuid} did not arrive ({why})"
        return failed

    async def _start_one(
        self,
        task: HostTask,
        mover: Mover,
        ctx: RequestContext,
        item: HostTaskItem,
        server: ServerOnHost,
    ) -> bool:
        assert server.compute_id is not None
        async with self.pool.acquire() as conn:
            node = await compute_nodes.get_by_id(conn, server.compute_id)

        async def claim(conn: Connection, migration: Migration) -> None:
            if not await host_tasks.claim_item(conn, task, item.id, migration.uuid):
                raise _ItemTaken()

        try:
            migration = await move_requests.record(
                self.pool, ctx, mover.kind, instance_uuid=server.uuid, source=node, then=claim
            )
        except _ItemTaken:
            return False
        if migration is None:
            return True  # it took a task meanwhile: it waits, the others go on
        outcome, error = await move_requests.cast_or_withdraw(
            self.pool, ctx, mover.kind, migration, mover.cast(self.conductor)
        )
        if outcome is move_requests.Outcome.WITHDRAWN:
            async with self.pool.acquire() as conn:
                await host_tasks.swap_item(
                    conn,
                    item.id,
                    expected=[ItemStatus.MOVING],
                    new=ItemStatus.PENDING,
                    message=f"its {mover.name} could not be cast ({error}); tried again",
                )
            return False
        LOG.info(
            "host task %d (%s of %s): %s %s of server %s started",
            task.id,
            task.kind,
            task.host,
            mover.name,
            migration.uuid,
            server.uuid,
            extra={"instance_uuid": str(server.uuid), "decision": "host_task_move_started"},
        )
        return True

    async def _finish(self, conn: Connection, task: HostTask, items: list[HostTaskItem]) -> None:
        failed = [i for i in items if i.status == ItemStatus.FAILED]
        if failed:
            await self._end(
                conn,
                task,
                f"{len(failed)} of {len(items)} server(s) could not be moved off {task.host}: "
                + listing(failed),
            )
            return
        moved = sum(i.status == ItemStatus.MOVED for i in items)
        message = f"{moved} server(s) moved off {task.host}"
        skipped = len(items) - moved
        if skipped:
            message += f", {skipped} no longer needed moving"
        if task.kind == "drain":
            message += (
                "; the host stays disabled: enable it (openstack compute service set --enable "
                f"{task.host} keel-compute) once its maintenance is over"
            )
        if await host_tasks.end(conn, task.id, TaskStatus.DONE, message):
            LOG.info(
                "host task %d (%s of %s) is done: %s",
                task.id,
                task.kind,
                task.host,
                message,
                extra={"decision": "host_task_done"},
            )

    async def _end(self, conn: Connection, task: HostTask, why: str) -> None:
        """End the task failed: ``why``, and its open items with it."""
        await host_tasks.fail_open_items(conn, task.id, f"not moved: {why}")
        if await host_tasks.end(conn, task.id, TaskStatus.FAILED, why):
            LOG.warning(
                "host task %d (%s of %s) failed: %s",
                task.id,
                task.kind,
                task.host,
                why,
                extra={"decision": "host_task_failed"},
            )

    async def _end_at_deadline(self, task: HostTask) -> None:
        async with self.pool.acquire() as conn:
            await host_tasks.fail_open_items(conn, task.id, "not moved before the task's deadline")
            items = await host_tasks.items(conn, task.id)
            left = [i for i in items if i.status == ItemStatus.FAILED]
            await self._end(
                conn,
                task,
                f"its deadline passed with {len(left)} of {len(items)} server(s) not moved off "
                f"{task.host}: {listing(left)}",
            )
