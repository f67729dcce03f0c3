"""What a host task needs of its host before it starts moves, asked at every pass.

* **drain**: the host's compute service disabled — done here first, with a reason naming
  the task, so the scheduler places nothing new there — and up: a cold migration needs
  the source's agent. While it is down the task waits (its deadline still runs);
* **evacuate**: the host fenced, by :func:`shared.host_fencing.fence_state`, the rule
  every evacuation obeys. While it is down but its fence's lease still runs, the task
  waits; once it is up again, or down without an armed fence and not forced down, the
  task ends failed with the reason ``evacuate`` would give. A host forced down with an
  armed fence counts as fenced: its evacuations are recorded at once and held until the
  lease has run out (:mod:`services.conductor.moves.held`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from shared import host_fencing
from shared.db import services
from shared.objects.host_task import HostTask, TaskKind
from shared.objects.service import Service

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gate:
    #: Why no move may start now (the task waits); ``None``: moves may start.
    waiting: str | None = None
    #: Why the task cannot go on at all (it ends failed).
    refused: str | None = None


def drain_reason(task: HostTask) -> str:
    """The compute service's disabled reason while a drain runs."""
    return f"draining: host task {task.id} ({task.uuid})"


async def gate_for(
    pool: asyncpg.Pool, task: HostTask, service: Service, *, down_time: float, margin: float
) -> Gate:
    if task.kind == TaskKind.DRAIN:
        await _disable(pool, task, service, down_time)
        if not service.is_up:
            return Gate(
                waiting=f"waiting: the compute service of {task.host} is down, and a cold "
                "migration needs its agent"
            )
        return Gate()
    async with pool.acquire() as conn:
        silent = await host_fencing.silent_for(conn, service.id)
    state = host_fencing.fence_state(service, silent, down_time=down_time, margin=margin)
    if state.fenced:
        return Gate()
    if state.seconds_left is not None:
        return Gate(waiting=f"waiting: {state.why}")
    return Gate(refused=state.why)


async def _disable(pool: asyncpg.Pool, task: HostTask, service: Service, down_time: float) -> None:
    """Disable the host with the task's reason, unless it already is with that reason."""
    reason = drain_reason(task)
    if service.disabled and service.disabled_reason == reason:
        return
    async with pool.acquire() as conn:
        await services.update_status(
            conn, service.uuid, down_time, disabled=True, disabled_reason=reason
        )
    LOG.warning(
        "host task %d disabled compute host %s before draining it (reason: %s; it was %s)",
        task.id,
        task.host,
        reason,
        f"disabled: {service.disabled_reason}" if service.disabled else "enabled",
        extra={"decision": "host_task_disabled_host"},
    )
