"""Scheduler latency and lost claims against a real PostgreSQL, at several cloud sizes.

What is measured: ``SchedulerManager.select_destinations`` (the scheduler's RPC endpoint,
called in-process, without RabbitMQ) for ``--requests`` requests at each
``--concurrency``, in a cloud of each ``--hosts`` size (grown in one database: 100, then
1,000, then 10,000 hosts). Each request claims an ``m1.medium``; each host fits four.
Concurrent requests that chose the same full host race for it, and the losers move on to
their next candidate: ``lost_claims`` counts those, per request. Requests share one
connection pool of ``--pool-size`` connections, as one keel-scheduler process does.

``--strategy sql`` (keel's scheduler) reads the best few candidates with one indexed
query; ``--strategy cache`` measures the design keel did not keep (every host cached in
the process, refreshed by changed rows, filtered in Python; ``benchkit/host_cache.py``).
``--subset-size`` is the scheduler's ``host_subset_size`` (default: keel's default).

After every run the capacity invariant is checked: usage equals the sum of allocations
on every node and none is over capacity (the script exits 1 if not). Timing targets are
printed as PASS/FAIL, never enforced. Run it with ``make bench`` or::

    .venv/bin/python bench/schedule.py --hosts 100 1000 10000 --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from benchkit import LoadResult, figures, report, run_load, target
from benchkit.db import (
    DEFAULT_PG_SERVER,
    HostSize,
    add_hosts,
    check_capacity,
    reset_claims,
    scratch_database,
)
from benchkit.host_cache import CachedHostManager

from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import SelectDestinations
from shared.config import DatabaseSettings, SchedulerSettings
from shared.context import RequestContext
from shared.db.pool import create_pool
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec

SERVICE_DOWN_TIME = 60.0
FLAVOR = FlavorSnapshot(flavorid="3", name="m1.medium", vcpus=2, memory_mb=4096, root_gb=40)
#: How many instances of ``FLAVOR`` one host fits (by vCPUs, RAM and disk alike).
SLOTS_PER_HOST = 4
HOST = HostSize(
    vcpus=FLAVOR.vcpus * SLOTS_PER_HOST,
    memory_mb=FLAVOR.memory_mb * SLOTS_PER_HOST,
    local_gb=FLAVOR.root_gb * SLOTS_PER_HOST,
)


@dataclass(frozen=True)
class Options:
    hosts: tuple[int, ...]
    requests: int
    concurrency: tuple[int, ...]
    pool_size: int
    subset_size: int
    strategy: str
    pg_server: str


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--hosts", type=int, nargs="+", default=[100, 1000, 10000], help="cloud sizes"
    )
    parser.add_argument("--requests", type=int, default=300, help="requests per run (300)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 8, 32], help="requests in flight"
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=DatabaseSettings().pool_max_size,
        help="database connections the scheduler may use (default: keel's default)",
    )
    parser.add_argument(
        "--subset-size",
        type=int,
        default=SchedulerSettings().host_subset_size,
        help="host_subset_size (default: keel's default)",
    )
    parser.add_argument("--strategy", choices=("sql", "cache"), default="sql")
    parser.add_argument("--pg-server", default=DEFAULT_PG_SERVER, help="PostgreSQL server URL")
    args = parser.parse_args(argv)
    counts = (*args.hosts, args.requests, args.pool_size, args.subset_size, *args.concurrency)
    if min(counts) < 1:
        parser.error("every count must be at least 1")
    return Options(
        hosts=tuple(sorted(args.hosts)),
        requests=args.requests,
        concurrency=tuple(args.concurrency),
        pool_size=args.pool_size,
        subset_size=args.subset_size,
        strategy=args.strategy,
        pg_server=args.pg_server,
    )


class DecisionCounter(logging.Handler):
    """Counts the scheduler's logged decisions (``host_selected``, ``claim_lost``, …)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        decision = getattr(record, "decision", None)
        if isinstance(decision, str):
            self.counts[decision] = self.counts.get(decision, 0) + 1


def setup_logging() -> DecisionCounter:
    """Warnings to standard error; the scheduler's INFO decisions only counted."""
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.WARNING)
    logging.getLogger().addHandler(stderr)
    counter = DecisionCounter()
    scheduler_log = logging.getLogger("services.scheduler.manager")
    scheduler_log.setLevel(logging.INFO)
    scheduler_log.propagate = False
    scheduler_log.addHandler(counter)
    return counter


def make_manager(options: Options, pool: asyncpg.Pool) -> SchedulerManager:
    kind = CachedHostManager if options.strategy == "cache" else HostManager
    hosts = kind(service_down_time=SERVICE_DOWN_TIME, host_subset_size=options.subset_size)
    return SchedulerManager(pool, hosts)


async def run_requests(manager: SchedulerManager, requests: int, concurrency: int) -> LoadResult:
    ctx = RequestContext(user_id="bench-user", project_id="bench-project", roles=("member",))
    bodies = [
        SelectDestinations(
            spec=RequestSpec(
                instance_uuid=uuid.uuid4(),
                project_id="bench-project",
                user_id="bench-user",
                flavor=FLAVOR,
            )
        )
        for _ in range(requests)
    ]

    async def select(index: int) -> None:
        await manager.select_destinations(ctx, bodies[index])

    return await run_load(select, requests, concurrency)


async def measure_size(
    options: Options, pool: asyncpg.Pool, hosts: int, counter: DecisionCounter
) -> bool:
    """Every concurrency at one cloud size; False if a capacity check failed."""
    manager = make_manager(options, pool)
    passed = True
    requests = min(options.requests, hosts * SLOTS_PER_HOST)
    for concurrency in options.concurrency:
        async with pool.acquire() as conn:
            await reset_claims(conn)
        await run_requests(manager, min(requests, 20), 1)  # warm: plans, cache, pool
        async with pool.acquire() as conn:
            await reset_claims(conn)
        counter.counts.clear()
        result = await run_requests(manager, requests, concurrency)
        lost = counter.counts.get("claim_lost", 0)
        shown = figures(result, noun="requests")
        report(
            "schedule",
            {
                "strategy": options.strategy,
                "hosts": hosts,
                "subset": options.subset_size,
                **shown,
                "lost_claims": lost,
                "lost_per_request": lost / requests,
            },
        )
        async with pool.acquire() as conn:
            check = await check_capacity(conn)
        report("capacity check", {"hosts": hosts, **check.figures()})
        passed = passed and check.passed
        judge(hosts, concurrency, result.percentile_ms(50), lost / requests)
    return passed


def judge(hosts: int, concurrency: int, p50_ms: float, lost_per_request: float) -> None:
    """The issue's targets, where this run measures them."""
    if concurrency == 1 and hosts == 1000:
        target("schedule p50 at 1,000 hosts", p50_ms, at_most=5, unit=" ms")
    if concurrency == 1 and hosts == 10000:
        target("schedule p50 at 10,000 hosts", p50_ms, at_most=25, unit=" ms")
    if concurrency == 8 and hosts == 1000:
        target("lost claims per request, c=8, 1,000 hosts", lost_per_request, at_most=0.1)


async def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    counter = setup_logging()
    settings = DatabaseSettings(
        pool_min_size=options.pool_size, pool_max_size=options.pool_size, connect_timeout=5
    )
    passed = True
    async with scratch_database(options.pg_server) as url:
        pool = await create_pool(url, settings)
        try:
            registered = 0
            for hosts in options.hosts:
                async with pool.acquire() as conn:
                    await add_hosts(conn, registered, hosts - registered, HOST)
                registered = hosts
                report(
                    "schedule setup",
                    {"hosts": hosts, "slots": hosts * SLOTS_PER_HOST, "flavor": FLAVOR.name,
                     "pool_size": options.pool_size, "strategy": options.strategy},
                )  # fmt: skip
                passed = await measure_size(options, pool, hosts, counter) and passed
        finally:
            await pool.close()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
