"""Resident memory of keel's processes: one agent, a simulated fleet, each control service.

What is measured (``VmRSS`` from ``/proc``, MiB): a real keel-conductor, keel-scheduler
and keel-api on a scratch database; one keel-compute process with the fake driver once
it is up; then one ``keel-fleet --hosts N`` process once all N agents are up (agents
sharing ``--agents-per-connection`` broker connections, keel-fleet's default unless
given); and the control services again with every agent registered and heartbeating.

Targets (one agent ≤ 80 MB; 1,000 simulated agents ≤ 1.5 GB) are printed as PASS/FAIL.
Run it with ``make bench`` or::

    .venv/bin/python bench/memory.py --fleet-hosts 1000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from benchkit import report, target
from benchkit.cloud import Cloud, CloudShape, bench_cloud

SETTLE_S = 2.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fleet-hosts", type=int, default=1000, help="agents in the fleet")
    parser.add_argument(
        "--agents-per-connection", type=int, default=100, help="agents per broker connection"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    args = parser.parse_args(argv)
    if min(args.fleet_hosts, args.agents_per_connection) < 1:
        parser.error("counts must be at least 1")
    return args


def control(cloud: Cloud) -> dict[str, object]:
    return {
        f"{name}_rss_mb": cloud.processes[name].rss_mb()
        for name in ("conductor", "scheduler1", "api")
    }


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shape = CloudShape(hosts=args.fleet_hosts, start_concurrency=100)
    async with bench_cloud(shape) as cloud:
        report("memory control", {"hosts": 0, **control(cloud)})
        agent = cloud.start_agent("single-agent")
        await cloud.wait_hosts_up(1, args.timeout)
        await asyncio.sleep(SETTLE_S)
        one = agent.rss_mb()
        report("memory agent", {"agents": 1, "rss_mb": one})
        fleet = cloud.start_fleet(per_connection=args.agents_per_connection)
        await cloud.wait_hosts_up(args.fleet_hosts + 1, args.timeout)
        await asyncio.sleep(SETTLE_S)
        whole = fleet.rss_mb()
        report(
            "memory fleet",
            {
                "agents": args.fleet_hosts,
                "agents_per_connection": args.agents_per_connection,
                "rss_mb": whole,
                "per_agent_kb": whole * 1024 / args.fleet_hosts,
            },
        )
        report("memory control", {"hosts": args.fleet_hosts + 1, **control(cloud)})
    target("memory: one agent", one, at_most=80, unit=" MB")
    if args.fleet_hosts >= 1000:
        target("memory: 1,000 simulated agents", whole, at_most=1536, unit=" MB")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
