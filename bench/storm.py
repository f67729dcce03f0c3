"""Start-up storm: N compute agents starting at once against one conductor.

What is measured: a real keel-conductor and keel-scheduler (console scripts, scratch
database, own exchange), then one ``keel-fleet --hosts N`` process whose agents all
start at once (``--start-concurrency N``): seconds from launching the fleet until the
database reports all N compute services up (each agent registered through the
conductor, declared and consumed its quorum queue, and sent its first heartbeat), and
the fleet's resident memory once they are up. Minimum-version queries during the storm
are reported once service-version caching exists in keel.

The target (all up within 30 s for 1,000 agents) is printed as PASS/FAIL. Run it with
``make bench`` or::

    .venv/bin/python bench/storm.py --hosts 1000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

from benchkit import not_available, report, target
from benchkit.cloud import CloudShape, bench_cloud


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", type=int, default=1000, help="agents starting at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    args = parser.parse_args(argv)
    if args.hosts < 1:
        parser.error("--hosts must be at least 1")
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shape = CloudShape(hosts=args.hosts, api=False, start_concurrency=0)
    async with bench_cloud(shape) as cloud:
        launched = time.monotonic()
        fleet = cloud.start_fleet()
        await cloud.wait_hosts_up(args.hosts, args.timeout)
        elapsed = time.monotonic() - launched
        report(
            "storm",
            {
                "hosts": args.hosts,
                "all_up_s": elapsed,
                "hosts_up/s": args.hosts / elapsed,
                "fleet_rss_mb": fleet.rss_mb(),
                "conductor_rss_mb": cloud.processes["conductor"].rss_mb(),
            },
        )
        if args.hosts >= 1000:
            target("storm: 1,000 agents all up", elapsed, at_most=30, unit=" s")
    not_available(
        "storm min-version",
        "keel has no minimum-service-version cache yet, so there are no queries to count",
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
