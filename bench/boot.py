"""End-to-end boot: M servers through the REST API by C concurrent clients on N hosts.

What is measured: a real keel-api, keel-conductor and keel-scheduler (console scripts,
scratch database, own exchange) and one ``keel-fleet --hosts N`` process (fake driver).
``--clients`` clients each create a server (``POST /v2.1/servers``, ``m1.tiny``) and wait
until it is ACTIVE, then create the next, until ``--servers`` were created; as
``openstack server create --wait`` would, but without polling the API: a watcher reads
the servers' states from the database every 20 ms. A boot's latency is from the start of
its POST to its ``launched_at`` (the same machine's clock).

Also counted, cheaply, per boot:

* RPC messages: two extra classic queues bound to the exchange (``cast.#``, ``call.#``)
  receive a copy of every cast and call published during the run; each call also has
  one reply (not counted in ``calls``);
* database work: ``pg_stat_database`` deltas of the scratch database — transactions
  committed, rows inserted/updated/deleted (pg_stat_statements is not loaded here).

Afterwards the capacity invariant is checked (usage equals allocations on every node,
none over capacity); the script exits 1 if it fails or a server did not become ACTIVE.
Targets (≥ 150 servers/s and p99 ≤ 2 s for 2,000 servers on 100 hosts) are printed as
PASS/FAIL. Run it with ``make bench`` or::

    .venv/bin/python bench/boot.py --servers 2000 --clients 50 --hosts 100

``--driver libvirt`` boots real guests instead, on agents of this machine's libvirtd,
and times them to their console marker (:mod:`benchkit.libvirt_boot`)::

    .venv/bin/python bench/boot.py --driver libvirt --servers 4 --clients 2 --hosts 2
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import aio_pika
import httpx
from benchkit import LoadResult, figures, libvirt_boot, report, run_load, target
from benchkit.cloud import (
    AMQP_URL,
    CIRROS_ID,
    Cloud,
    CloudShape,
    bench_cloud,
    machine_cpu_seconds,
    server_cpu_seconds,
)
from benchkit.db import check_capacity

from shared.exceptions import BuildFailed

WATCH_INTERVAL = 0.02
STATS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--servers", type=int, default=2000, help="servers to boot (2000)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (50)")
    parser.add_argument("--hosts", type=int, default=100, help="simulated hosts (100)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-server limit (s)")
    parser.add_argument(
        "--driver",
        choices=("fake", "libvirt"),
        default="fake",
        help="fake: a keel-fleet of simulated hosts (default); libvirt: real guests on this "
        "machine's libvirtd, timed to their console marker (use small sizes, e.g. "
        "--servers 4 --clients 2 --hosts 2)",
    )
    args = parser.parse_args(argv)
    if min(args.servers, args.clients, args.hosts) < 1:
        parser.error("every count must be at least 1")
    return args


class Watcher:
    """Resolves each server's future when the database shows it ACTIVE (or ERROR)."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud
        self.pending: dict[UUID, asyncio.Future[float]] = {}

    def expect(self, server: UUID) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pending[server] = future
        return future

    async def run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            if not self.pending:
                continue
            async with self.cloud.pool.acquire() as conn:
                rows = await conn.fetch(
                    """SELECT uuid, vm_state, extract(epoch FROM launched_at)::float8 AS at
                         FROM instances
                        WHERE uuid = ANY($1::uuid[]) AND vm_state IN ('active', 'error')""",
                    list(self.pending),
                )
            for row in rows:
                future = self.pending.pop(row["uuid"])
                if row["vm_state"] == "active":
                    future.set_result(row["at"])
                else:
                    future.set_exception(BuildFailed(f"server {row['uuid']} went to ERROR"))


class Taps:
    """Copies of every cast and call on the cloud's exchange, counted at the end."""

    def __init__(self, exchange: str) -> None:
        self.exchange = exchange
        self.queues = {kind: f"{exchange}.bench-tap.{kind}" for kind in ("cast", "call")}

    async def __aenter__(self) -> Taps:
        self.connection = await aio_pika.connect(AMQP_URL)
        channel = await self.connection.channel()
        for kind, name in self.queues.items():
            queue = await channel.declare_queue(name, auto_delete=False)
            await queue.bind(self.exchange, routing_key=f"{kind}.#")
        return self

    async def counts(self) -> dict[str, int]:
        channel = await self.connection.channel()
        found = {}
        for kind, name in self.queues.items():
            queue = await channel.declare_queue(name, passive=True)
            found[kind] = queue.declaration_result.message_count or 0
        return found

    async def __aexit__(self, *exc: object) -> None:
        channel = await self.connection.channel()
        for name in self.queues.values():
            await channel.queue_delete(name)
        await self.connection.close()


async def db_stats(cloud: Cloud) -> dict[str, int]:
    async with cloud.pool.acquire() as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow(
            f"SELECT {', '.join(STATS)} FROM pg_stat_database WHERE datname = current_database()"
        )
    assert row is not None
    return {name: int(row[name]) for name in STATS}


async def boot_servers(
    http: httpx.AsyncClient, watcher: Watcher, count: int, clients: int, limit: float
) -> LoadResult:
    async def boot(index: int) -> None:
        body = {"server": {"name": f"boot-{index}", "flavorRef": "1", "imageRef": str(CIRROS_ID)}}
        started = time.time()
        response = await http.post("servers", json=body)
        if response.status_code != 202:
            raise BuildFailed(f"POST /servers answered {response.status_code}: {response.text}")
        server = UUID(response.json()["server"]["id"])
        active_at = await asyncio.wait_for(watcher.expect(server), limit)
        if active_at < started:
            raise BuildFailed("clock went backwards")

    return await run_load(boot, count, clients)


def cpu_snapshot(cloud: Cloud) -> dict[str, float]:
    """CPU seconds used so far by each keel process and by the whole machine."""
    busy, total = machine_cpu_seconds()
    used = {name: p.cpu_seconds() for name, p in cloud.processes.items()}
    return {**used, **server_cpu_seconds(), "machine busy": busy, "machine total": total}


async def measure(cloud: Cloud, args: argparse.Namespace) -> tuple[LoadResult, dict[str, Any]]:
    headers = {"X-Auth-Token": cloud.token}
    # Idle connections are dropped before uvicorn closes them (after 5 s) under a request.
    limits = httpx.Limits(
        max_connections=args.clients, max_keepalive_connections=args.clients, keepalive_expiry=2
    )
    async with httpx.AsyncClient(
        base_url=cloud.api_url + "/v2.1/", headers=headers, timeout=60, limits=limits
    ) as http:
        unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
        response = await http.put("os-quota-sets/bench-project", json=unlimited)
        response.raise_for_status()
        watcher = Watcher(cloud)
        watching = asyncio.create_task(watcher.run())
        try:
            await boot_servers(http, watcher, min(args.clients, 20), args.clients, 60)
            async with Taps(cloud.exchange) as taps:
                before = await db_stats(cloud)
                cpu_before = cpu_snapshot(cloud)
                result = await boot_servers(http, watcher, args.servers, args.clients, args.timeout)
                cpu_after = cpu_snapshot(cloud)
                after = await db_stats(cloud)
                messages = await taps.counts()
        finally:
            watching.cancel()
    booted = max(result.succeeded, 1)
    per_boot: dict[str, Any] = {
        "casts/boot": messages["cast"] / booted,
        "calls/boot": messages["call"] / booted,
        **{f"{name}/boot": (after[name] - before[name]) / booted for name in STATS},
    }
    spent = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
    for name in cloud.processes:
        per_boot[f"{name}_cpu_ms/boot"] = spent[name] * 1000 / booted
    for name in ("postgresql", "rabbitmq"):
        per_boot[f"{name}_cpu_ms/boot"] = spent[name] * 1000 / booted
    # Everything on the machine (PostgreSQL, RabbitMQ, this script, other people's work).
    per_boot["machine_cpu_ms/boot"] = spent["machine busy"] * 1000 / booted
    per_boot["machine_busy_%"] = 100 * spent["machine busy"] / spent["machine total"]
    return result, per_boot


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.driver == "libvirt":
        return await libvirt_boot.run(args)
    shape = CloudShape(hosts=args.hosts)
    async with bench_cloud(shape) as cloud:
        cloud.start_fleet()
        await cloud.wait_hosts_up(args.hosts, 300)
        result, per_boot = await measure(cloud, args)
        async with cloud.pool.acquire() as conn:
            check = await check_capacity(conn)
    report(
        "boot",
        {"hosts": args.hosts, **figures(result, noun="servers"), **per_boot},
    )
    report("capacity check", check.figures())
    if args.servers >= 2000 and args.hosts >= 100:
        target("boot servers/s (2,000 on 100 hosts)", result.rate, at_least=150, unit="/s")
        target(
            "boot p99 (2,000 on 100 hosts)", result.percentile_ms(99) / 1000, at_most=2, unit=" s"
        )
    return 0 if check.passed and result.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
