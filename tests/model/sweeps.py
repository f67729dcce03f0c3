"""The conductor's periodic sweep, built as ``run_conductor`` builds it, run on demand.

The model never lets a timer decide when a sweep runs: its ``sweep`` rule (and every
settle) runs the conductor's one deadline sweep (:class:`~services.conductor.deadlines.
Deadlines`: builds, moves, confirm windows and stalled endings, every other task) as an
activity of the conductor process, so a sweep can be paused or killed like any handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from services.compute.rpcapi import ComputeAPI
from services.conductor.deadlines import Deadlines
from services.conductor.rpcapi import ConductorAPI
from shared.config import Settings
from shared.rpc.transport import Transport

Job = Callable[[], Awaitable[object]]


def conductor_jobs(
    settings: Settings, pool: asyncpg.Pool, transport: Transport
) -> list[tuple[str, Job]]:
    compute = ComputeAPI(transport, timeout=settings.rpc.call_timeout)
    conductor = ConductorAPI(transport, timeout=settings.rpc.call_timeout)
    return [("deadline sweep", Deadlines(pool, compute, settings, conductor).sweep)]
