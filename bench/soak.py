"""Soak: create and delete servers in a loop for a fixed time; watch what could grow.

A real keel-api, keel-conductor and keel-scheduler and one ``keel-fleet`` process (fake
driver) run on a scratch database and exchange. ``--clients`` clients each create a
server, wait until it is ACTIVE, delete it, wait until it is gone, and start again, for
``--seconds``. Every ``--sample`` seconds one line is printed with what a leak would
make grow: the resident memory of each process, the database connections of the
scratch database, the messages waiting in keel's queues, the claims (allocations) held
and the servers alive.

At the end the first sample after the warm-up is compared with the last: the growth
of each figure is printed, with a verdict (``bounded`` when every process's memory grew
by less than ``--rss-slack`` MB, no process opened more than one more database
connection, and no message is left queued). Figures are printed, never asserted. Run
it with ``make bench`` or::

    .venv/bin/python bench/soak.py --seconds 120 --clients 10 --hosts 10
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import aio_pika
import httpx
from benchkit import report
from benchkit.cloud import AMQP_URL, CIRROS_ID, Cloud, CloudShape, bench_cloud
from benchkit.db import check_capacity

from shared.exceptions import BuildFailed
from shared.rpc.amqp_topology import Topology

POLL_S = 0.05
SETTLE_TIMEOUT = 60.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to loop (120)")
    parser.add_argument("--clients", type=int, default=10, help="concurrent clients (10)")
    parser.add_argument("--hosts", type=int, default=10, help="simulated hosts (10)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    parser.add_argument(
        "--warmup", type=int, default=1, help="samples before the baseline is taken (1)"
    )
    parser.add_argument(
        "--rss-slack", type=float, default=20.0, help="memory growth still called bounded (MB)"
    )
    args = parser.parse_args(argv)
    if min(args.clients, args.hosts) < 1 or args.seconds <= 0 or args.sample <= 0:
        parser.error("counts and durations must be positive")
    return args


class Loop:
    """Clients creating and deleting servers until told to stop."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.stopping = asyncio.Event()
        self.cycles = 0
        self.failures = 0

    async def _status(self, server_id: str) -> str | None:
        response = await self.http.get(f"servers/{server_id}")
        if response.status_code == 404:
            return None
        status: str = response.json()["server"]["status"]
        return status

    async def _until(self, server_id: str, wanted: str | None) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while (status := await self._status(server_id)) != wanted:
            if status == "ERROR" or time.monotonic() > deadline:
                raise BuildFailed(f"server {server_id} is {status}, not {wanted}")
            await asyncio.sleep(POLL_S)

    async def client(self, number: int) -> None:
        while not self.stopping.is_set():
            body = {"server": {"name": f"soak-{number}", "flavorRef": "1",
                               "imageRef": str(CIRROS_ID)}}  # fmt: skip
            try:
                created = await self.http.post("servers", json=body)
                if created.status_code != 202:
                    raise BuildFailed(f"POST /servers answered {created.status_code}")
                server_id = created.json()["server"]["id"]
                await self._until(server_id, "ACTIVE")
                await self.http.delete(f"servers/{server_id}")
                await self._until(server_id, None)
                self.cycles += 1
            except (BuildFailed, httpx.HTTPError) as exc:
                self.failures += 1
                print(f"soak client {number}: {exc}", file=sys.stderr)


async def queue_depth(cloud: Cloud) -> int:
    """Messages waiting in every keel queue of the cloud's exchange."""
    topology = Topology(cloud.exchange)
    connection = await aio_pika.connect(AMQP_URL)
    waiting = 0
    async with connection:
        channel = await connection.channel()
        for topic in await cloud.topics():
            queue = await channel.declare_queue(topology.queue_name(topic), passive=True)
            waiting += queue.declaration_result.message_count or 0
    return waiting


async def sample(cloud: Cloud, loop: Loop, started: float) -> dict[str, Any]:
    async with cloud.pool.acquire() as conn:
        connections = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        )
        claims = await conn.fetchval("SELECT count(*) FROM allocations")
        alive = await conn.fetchval("SELECT count(*) FROM instances WHERE deleted_at IS NULL")
    figures: dict[str, Any] = {
        "t_s": time.monotonic() - started,
        "cycles": loop.cycles,
        "failures": loop.failures,
        **{f"{name}_rss_mb": p.rss_mb() for name, p in cloud.processes.items()},
        "db_connections": connections,
        "queued_messages": await queue_depth(cloud),
        "claims": claims,
        "servers": alive,
    }
    return figures


def growth(first: dict[str, Any], last: dict[str, Any], rss_slack: float) -> dict[str, Any]:
    """How much each figure grew; bounded when memory stayed within the slack, nothing is
    left queued, and at most one more connection per process was opened (a pool may
    still open one it had not needed yet)."""
    rss = {k: last[k] - first[k] for k in first if k.endswith("_rss_mb")}
    steady = {k: last[k] - first[k] for k in ("db_connections", "queued_messages")}
    bounded = (
        all(v < rss_slack for v in rss.values())
        and steady["db_connections"] <= len(rss)
        and last["queued_messages"] == 0
    )
    return {
        **{f"{k}_growth": v for k, v in rss.items()},
        **{f"{k}_growth": v for k, v in steady.items()},
        "verdict": "bounded" if bounded else "grew",
    }


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shape = CloudShape(hosts=args.hosts, report_interval=2.0)
    async with bench_cloud(shape) as cloud:
        cloud.start_fleet()
        await cloud.wait_hosts_up(args.hosts, 300)
        headers = {"X-Auth-Token": cloud.token}
        async with httpx.AsyncClient(
            base_url=cloud.api_url + "/v2.1/", headers=headers, timeout=60
        ) as http:
            unlimited = {"quota_set": {"instances": -1, "cores": -1, "ram": -1}}
            (await http.put("os-quota-sets/bench-project", json=unlimited)).raise_for_status()
            loop = Loop(http)
            started = time.monotonic()
            clients = [asyncio.create_task(loop.client(n)) for n in range(args.clients)]
            samples = []
            try:
                while time.monotonic() - started < args.seconds:
                    await asyncio.sleep(min(args.sample, args.seconds))
                    cloud.check_alive()
                    samples.append(await sample(cloud, loop, started))
                    report("soak sample", samples[-1])
            finally:
                loop.stopping.set()
                await asyncio.gather(*clients)
        await asyncio.sleep(2 * shape.report_interval)
        final = await sample(cloud, loop, started)
        report("soak after", final)
        async with cloud.pool.acquire() as conn:
            check = await check_capacity(conn)
    baseline = samples[min(args.warmup, len(samples) - 1)] if samples else final
    report(
        "soak",
        {
            "seconds": args.seconds,
            "clients": args.clients,
            "hosts": args.hosts,
            "cycles": loop.cycles,
            "failures": loop.failures,
            "claims_left": final["claims"],
            "servers_left": final["servers"],
            **growth(baseline, final, args.rss_slack),
        },
    )
    report("capacity check", check.figures())
    return 1 if loop.failures or final["claims"] or not check.passed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
