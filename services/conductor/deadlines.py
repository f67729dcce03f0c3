"""Every non-terminal state has an owner and a deadline: the conductors' one sweep.

Every conductor runs this sweep periodically; several sweep safely at once, because
each thing a sweep ends is ended by a compare-and-swap (or rows locked and skipped by
the others), so one of them wins and the rest find it done. A pass:

* **builds** past ``KEEL_BUILD_TIMEOUT`` (:mod:`services.conductor.builds.deadline`):
  ERROR, claims released;
* **moves** ``accepted`` or ``pre-migrating`` past ``KEEL_MOVE_TIMEOUT``
  (:mod:`services.conductor.moves.deadline`): record ``error``, the move's claim
  released; an evacuated server in ERROR, a migrated one back on its source;
* **cold migrations** ``finished`` past ``KEEL_RESIZE_CONFIRM_WINDOW`` (auto-confirm),
  and ``confirming``/``reverting`` stalled for two RPC call timeouts (that step run
  again) (:mod:`services.conductor.moves.sweep`);
* **evacuations held** for their source's fence, once its lease has run out
  (:mod:`services.conductor.moves.held`): sent on;
* **soft-deleted servers** older than ``KEEL_RECLAIM_INSTANCE_INTERVAL``
  (:mod:`services.conductor.reclaim`): deleted for good;
* **shelves** (:class:`~services.conductor.shelving.ShelveDeadline`): a shelve or an
  in-place unshelve past ``KEEL_TASK_TIMEOUT`` left as it was, an offload past it
  completed, an unshelve's build past ``KEEL_BUILD_TIMEOUT`` back to SHELVED_OFFLOADED,
  and servers shelved for longer than a positive ``KEEL_SHELVED_OFFLOAD_TIME`` offloaded;
* **deletes, soft deletes and restores no agent took** past ``KEEL_TASK_TIMEOUT``
  (:mod:`services.conductor.promised_requests`): sent again while their host's compute
  service is up, and never cleared while it exists (keel-api answered that they would
  happen, or may have without being able to withdraw them); nor is a soft delete or a
  restore an agent took and has not finished;
* **every other task** — stop, start, reboot, delete, rebuild, soft delete, restore,
  snapshot — past ``KEEL_TASK_TIMEOUT`` (:class:`TaskDeadline`): the task is cleared (a
  server still building goes back to its build's task, which the build deadline ends; a
  rebuild ends in ERROR; a snapshot's unfinished image is killed) and its instance
  action recorded as timed out; the power state follows the agent's next guest report.

A deadline of 0 disables that one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.builds.deadline import BuildDeadline
from services.conductor.moves import live_deadline
from services.conductor.moves.deadline import MoveDeadline
from services.conductor.moves.held import HeldMoves
from services.conductor.moves.sweep import MigrationSweep
from services.conductor.promised_requests import LEFT_BY_THE_TASK_DEADLINE_SQL, PromisedRequests
from services.conductor.reclaim import SoftDeleteReclaim
from services.conductor.rpcapi import ConductorAPI
from services.conductor.shelving import ShelveDeadline
from shared.config import Settings
from shared.db import instance_actions, snapshots
from shared.objects.states import SNAPSHOT_TASKS, TaskState

LOG = logging.getLogger(__name__)

#: Longest pause between two sweeps, in seconds.
MAX_INTERVAL = 60.0

#: The instance action a backup's snapshot tasks belong to (a snapshot's are below).
BACKUP_ACTION = "createBackup"

#: The tasks the task deadline ends, and the instance action each belongs to.
TASK_ACTIONS: dict[TaskState, str] = {
    TaskState.POWERING_OFF: "stop",
    TaskState.POWERING_ON: "start",
    TaskState.REBOOTING: "reboot",
    TaskState.REBOOTING_HARD: "reboot",
    TaskState.DELETING: "delete",
    TaskState.REBUILD_SPAWNING: "rebuild",
    # A soft delete or a restore is cleared only once its host's compute service is
    # deleted (promised_requests): the server is left as it was, soft-deleted or not.
    TaskState.SOFT_DELETING: "delete",
    TaskState.RESTORING: "restore",
    # A snapshot that overran leaves the server as it was; its image is killed.
    TaskState.IMAGE_SNAPSHOT: "createImage",
    TaskState.IMAGE_PENDING_UPLOAD: "createImage",
    TaskState.IMAGE_UPLOADING: "createImage",
}


class TaskDeadline:
    """Clears power and delete tasks that overran ``KEEL_TASK_TIMEOUT``."""

    def __init__(self, pool: asyncpg.Pool, timeout: float) -> None:
        self.pool = pool
        self.timeout = timeout

    async def sweep(self) -> int:
        if self.timeout <= 0:
            return 0
        async with self.pool.acquire() as conn, conn.transaction():
            # A server still building goes back to its build's task (a delete cut off
            # before it reached anyone leaves the build to its own deadline), any other
            # to none; a rebuild that did not finish is ERROR (its old guest may be gone,
            # its new one not made).
            rows = await conn.fetch(
                f"""UPDATE instances i
                      SET task_state = CASE WHEN i.vm_state <> 'building' THEN NULL
                                            WHEN i.host IS NULL THEN 'scheduling'
                                            ELSE 'spawning' END,
                          vm_state = CASE WHEN old.task_state = 'rebuild_spawning'
                                          THEN 'error' ELSE i.vm_state END,
                          updated_at = now()
                     FROM (SELECT i.id, i.task_state FROM instances i
                            WHERE i.task_state = ANY($1::text[]) AND i.deleted_at IS NULL
                              AND i.updated_at < now() - make_interval(secs => $2)
                              AND NOT {LEFT_BY_THE_TASK_DEADLINE_SQL}
                            ORDER BY i.id LIMIT 100
                              FOR UPDATE OF i SKIP LOCKED) old
                    WHERE i.id = old.id AND i.task_state = old.task_state
                RETURNING i.uuid, old.task_state""",
                [task.value for task in TASK_ACTIONS],
                self.timeout,
            )
            for row in rows:
                actions = [TASK_ACTIONS[TaskState(row["task_state"])]]
                if TaskState(row["task_state"]) in SNAPSHOT_TASKS:
                    await snapshots.kill_unfinished(conn, row["uuid"])
                    # The same tasks are a backup's (createBackup).
                    actions.append(BACKUP_ACTION)
                for action in actions:
                    await instance_actions.finish(
                        conn,
                        row["uuid"],
                        action,
                        f"timed out: no agent finished it within {self.timeout:g}s "
                        "(KEEL_TASK_TIMEOUT); the power state follows the host's next report",
                    )
            abandoned = await snapshots.kill_abandoned(conn, self.timeout)
        for image_id in abandoned:
            LOG.warning(
                "snapshot image %s still had no data %gs after it was made, and its server "
                "is no longer taking a snapshot: killed",
                image_id,
                self.timeout,
                extra={"decision": "snapshot_abandoned"},
            )
        for row in rows:
            LOG.warning(
                "task %s of server %s did not finish within %gs: cleared; its power state "
                "follows its host's next guest report",
                row["task_state"],
                row["uuid"],
                self.timeout,
                extra={"instance_uuid": str(row["uuid"]), "decision": "task_timed_out"},
            )
        return len(rows)


class Deadlines:
    """The one periodic sweep of a conductor (see the module docstring)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        compute: ComputeAPI,
        settings: Settings,
        conductor: ConductorAPI | None = None,
    ) -> None:
        """``conductor``: also send held evacuations on in each pass (keel-conductor runs
        :class:`HeldMoves` on a shorter period of its own instead)."""
        down_time = settings.service_down_time
        self.held = None if conductor is None else HeldMoves(pool, conductor)
        self.build = BuildDeadline(pool, settings.build_timeout)
        self.moves = MoveDeadline(
            pool,
            compute,
            timeout=settings.move_timeout,
            down_time=down_time,
            margin=settings.fencing.margin,
        )
        self.endings = MigrationSweep(
            pool,
            compute,
            confirm_window=settings.resize_confirm_window,
            stall_after=2 * settings.rpc.call_timeout,
            down_time=down_time,
        )
        self.tasks = TaskDeadline(pool, settings.task_timeout)
        self.promised_requests = PromisedRequests(
            pool, compute, timeout=settings.task_timeout, down_time=down_time
        )
        self.reclaim = SoftDeleteReclaim(
            pool, compute, interval=settings.reclaim_instance_interval, down_time=down_time
        )
        self.shelves = ShelveDeadline(
            pool,
            compute,
            task_timeout=settings.task_timeout,
            build_timeout=settings.build_timeout,
            offload_time=settings.shelved_offload_time,
            down_time=down_time,
        )
        self._timeouts = [
            t
            for t in (
                settings.build_timeout,
                settings.move_timeout,
                settings.task_timeout,
                settings.shelved_offload_time,
            )
            if t > 0
        ]

    async def _live_migrations(self) -> int:
        return await live_deadline.sweep(
            self.moves.pool,
            self.moves.compute,
            timeout=self.moves.timeout,
            down_time=self.moves.down_time,
        )

    @property
    def interval(self) -> float:
        """Often enough that any deadline is overrun by a tenth at most."""
        shortest = min([self.endings.interval * 10, *self._timeouts])
        return min(MAX_INTERVAL, max(shortest / 10, 0.5))

    async def sweep(self) -> int:
        """One pass over every deadline; how many things it ended or drove on."""
        done = 0
        # Tasks first: a delete that timed out on a server still building hands the server
        # back to its build, whose deadline this same pass may then end.
        steps: list[tuple[str, Callable[[], Awaitable[int]]]] = [
            ("task", self.tasks.sweep),
            ("promised request", self.promised_requests.sweep),
            ("build", self.build.sweep),
            ("move", self.moves.sweep),
            ("live migration", self._live_migrations),
            ("migration", self.endings.sweep),
            ("reclaim", self.reclaim.sweep),
            ("shelve", self.shelves.sweep),
        ]
        if self.held is not None:
            steps.append(("held evacuation", self.held.sweep))
        for name, step in steps:
            if name == "build" and not self.build.enabled:
                continue
            try:
                done += await step()
            except Exception as exc:  # one kind's trouble must not stop the others
                LOG.warning("the %s deadline sweep failed and runs again later: %s", name, exc)
        return done
