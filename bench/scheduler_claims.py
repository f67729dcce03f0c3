"""Scheduler throughput and latency: filter, weigh and claim against a real PostgreSQL.

What is measured: ``SchedulerManager.select_destinations`` (the scheduler's RPC endpoint,
called in-process, without RabbitMQ) over ``--hosts`` compute hosts, ``--requests``
requests per run, once for each ``--concurrency``. Every request loads all host states in
one query, filters and weighs them in memory and claims an ``m1.medium`` on the best host
with an atomic ``UPDATE``; concurrent requests that chose the same host race for it, and
the losers move on to their next candidate (counted as ``lost_claims``). Requests share
one connection pool of ``--pool-size`` connections, as one keel-scheduler process does,
so at a concurrency above the pool size the latency includes waiting for a connection.

Each host fits four ``m1.medium`` instances. Before each run the claims of the previous
one are released and every host heartbeats; after it, every compute node is read back to
check that none is over capacity and that its usage equals the sum of its allocations
(the script exits 1 if not). Timing figures are printed, never judged.

The benchmark creates its own database on the server (``--pg-server``) and drops it at
the end, even on failure. Run it with ``make bench`` (all benchmarks) or::

    .venv/bin/python bench/scheduler_claims.py --hosts 200 --requests 500 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from uuid import UUID

import asyncpg
from benchkit import LoadResult, figures, report, run_load
from pydantic import BaseModel

from services.scheduler.host_manager import HostManager
from services.scheduler.manager import SchedulerManager
from services.scheduler.rpcapi import SelectDestinations
from shared.config import DatabaseSettings
from shared.context import RequestContext
from shared.db import compute_nodes, migrate, services
from shared.db.pool import create_pool
from shared.objects.compute_node import NodeResources
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import RequestSpec
from shared.objects.service import Binary
from shared.versions import SERVICE_VERSION

DEFAULT_PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
SERVICE_DOWN_TIME = 60.0
COMPUTE_TOPIC = "compute"
FLAVOR = FlavorSnapshot(flavorid="3", name="m1.medium", vcpus=2, memory_mb=4096, root_gb=40)
#: How many instances of ``FLAVOR`` one host fits (by vCPUs, RAM and disk alike).
SLOTS_PER_HOST = 4


@dataclass(frozen=True)
class Options:
    hosts: int
    requests: int
    concurrency: tuple[int, ...]
    pool_size: int
    pg_server: str


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", type=int, default=200, help="compute hosts (default 200)")
    parser.add_argument("--requests", type=int, default=500, help="requests per run (500)")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 8, 32],
        help="requests in flight; one run per value (default 1 8 32)",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=DatabaseSettings().pool_max_size,
        help="database connections the scheduler may use (default: keel's default)",
    )
    parser.add_argument("--pg-server", default=DEFAULT_PG_SERVER, help="PostgreSQL server URL")
    args = parser.parse_args(argv)
    if min(args.hosts, args.requests, args.pool_size, *args.concurrency) < 1:
        parser.error("every count must be at least 1")
    return Options(
        hosts=args.hosts,
        requests=args.requests,
        concurrency=tuple(args.concurrency),
        pool_size=args.pool_size,
        pg_server=args.pg_server,
    )


@asynccontextmanager
async def scratch_database(server: str) -> AsyncIterator[str]:
    """A new, migrated database on ``server``; dropped on the way out, whatever happened."""
    name = f"keel_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        url = f"{server.rpartition('/')[0]}/{name}"
        conn = await asyncpg.connect(url)
        try:
            await migrate.sync(conn)
        finally:
            await conn.close()
        yield url
    finally:
        admin = await asyncpg.connect(server)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def host_resources(name: str) -> NodeResources:
    return NodeResources(
        hypervisor_hostname=name,
        vcpus=FLAVOR.vcpus * SLOTS_PER_HOST,
        memory_mb=FLAVOR.memory_mb * SLOTS_PER_HOST,
        local_gb=FLAVOR.root_gb * SLOTS_PER_HOST,
        cpu_allocation_ratio=1.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
    )


async def register_hosts(pool: asyncpg.Pool, count: int) -> list[UUID]:
    """One compute service and node per host, as the conductor registers agents."""
    service_uuids: list[UUID] = []
    async with pool.acquire() as conn:
        for number in range(count):
            host = f"bench-compute-{number:04d}"
            service = await services.get_or_create(
                conn,
                host=host,
                binary=Binary.COMPUTE.value,
                topic=COMPUTE_TOPIC,
                version=SERVICE_VERSION,
                down_time=SERVICE_DOWN_TIME,
            )
            await compute_nodes.upsert(
                conn,
                node_uuid=uuid.uuid4(),
                service_id=service.id,
                host=host,
                resources=host_resources(host),
            )
            service_uuids.append(service.uuid)
    return service_uuids


async def prepare_run(pool: asyncpg.Pool, service_uuids: Sequence[UUID]) -> None:
    """Release every claim of the previous run and mark every host alive."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM allocations")
        await conn.execute(
            "UPDATE compute_nodes SET vcpus_used = 0, memory_mb_used = 0, local_gb_used = 0"
        )
        for service_uuid in service_uuids:
            await services.heartbeat(conn, service_uuid, SERVICE_VERSION)


class ClaimedTotals(BaseModel):
    """What the ``allocations`` of one compute node add up to."""

    compute_node_id: int
    count: int
    vcpus: int
    memory_mb: int
    local_gb: int


@dataclass(frozen=True)
class CapacityCheck:
    nodes: int
    allocations: int
    over_capacity: int
    usage_mismatch: int

    @property
    def passed(self) -> bool:
        return self.over_capacity == 0 and self.usage_mismatch == 0


async def check_capacity(pool: asyncpg.Pool) -> CapacityCheck:
    """Read every node back; count those over capacity or whose usage is not their claims."""
    async with pool.acquire() as conn:
        nodes = [h.node for h in await compute_nodes.host_states(conn, SERVICE_DOWN_TIME)]
        rows = await conn.fetch(
            """SELECT compute_node_id, count(*) AS count, sum(vcpus) AS vcpus,
                      sum(memory_mb) AS memory_mb, sum(local_gb) AS local_gb
                 FROM allocations GROUP BY compute_node_id"""
        )
    claimed = {t.compute_node_id: t for t in (ClaimedTotals.model_validate(dict(r)) for r in rows)}
    over = [n for n in nodes if min(n.free_vcpus, n.free_ram_mb, n.free_disk_gb) < 0]
    mismatched = []
    for node in nodes:
        totals = claimed.get(node.id)
        usage = (node.vcpus_used, node.memory_mb_used, node.local_gb_used)
        expected = (totals.vcpus, totals.memory_mb, totals.local_gb) if totals else (0, 0, 0)
        if usage != expected:
            mismatched.append(node)
    return CapacityCheck(
        nodes=len(nodes),
        allocations=sum(t.count for t in claimed.values()),
        over_capacity=len(over),
        usage_mismatch=len(mismatched),
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


async def measure(
    options: Options, pool: asyncpg.Pool, service_uuids: Sequence[UUID], counter: DecisionCounter
) -> bool:
    """One run per concurrency, each followed by a capacity check; False if a check failed."""
    manager = SchedulerManager(pool, HostManager(service_down_time=SERVICE_DOWN_TIME))
    await prepare_run(pool, service_uuids)
    await run_requests(manager, options.pool_size * 2, options.pool_size)
    passed = True
    for concurrency in options.concurrency:
        await prepare_run(pool, service_uuids)
        counter.counts.clear()
        result = await run_requests(manager, options.requests, concurrency)
        lost = counter.counts.get("claim_lost", 0)
        report("scheduler claims", {"hosts": options.hosts, **figures(result, noun="requests")})
        check = await check_capacity(pool)
        report(
            "capacity check",
            {
                "nodes": check.nodes,
                "allocations": check.allocations,
                "lost_claims": lost,
                "over_capacity": check.over_capacity,
                "usage_mismatch": check.usage_mismatch,
                "result": "ok" if check.passed else "FAILED",
            },
        )
        passed = passed and check.passed
    return passed


def setup_logging() -> DecisionCounter:
    """Warnings to standard error; the scheduler's INFO decisions only counted."""
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.WARNING)
    logging.getLogger().addHandler(stderr)
    counter = DecisionCounter()
    scheduler_log = logging.getLogger("services.scheduler.manager")
    scheduler_log.setLevel(logging.INFO)
    scheduler_log.addHandler(counter)
    return counter


async def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    counter = setup_logging()
    settings = DatabaseSettings(
        pool_min_size=options.pool_size, pool_max_size=options.pool_size, connect_timeout=5
    )
    async with scratch_database(options.pg_server) as url:
        pool = await create_pool(url, settings)
        try:
            service_uuids = await register_hosts(pool, options.hosts)
            report(
                "scheduler setup",
                {
                    "hosts": options.hosts,
                    "slots": options.hosts * SLOTS_PER_HOST,
                    "flavor": FLAVOR.name,
                    "pool_size": options.pool_size,
                },
            )
            passed = await measure(options, pool, service_uuids, counter)
        finally:
            await pool.close()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
