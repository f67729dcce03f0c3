"""Start-up storm: N compute agents starting at once against one conductor.

What is measured: a real keel-conductor and keel-scheduler (console scripts, scratch
database, own exchange), then one ``keel-fleet --hosts N`` process whose agents all
start at once (``--start-concurrency N``): seconds from launching the fleet until the
database reports all N compute services up (each agent registered through the
conductor, declared and consumed its quorum queue, and sent its first heartbeat), and
the fleet's resident memory once they are up; and how many times keel-conductor queried
the minimum service version of each binary during the storm (its
``keel_min_service_version_queries`` counter, read from its metrics endpoint before and
after), against what its cache allows: one per binary per TTL window
(``KEEL_SERVICE_VERSION_CACHE_TTL``, 60 s by default) the storm spans.

The targets (all up within 30 s for 1,000 agents; at most one minimum-version query per
binary per TTL) are printed as PASS/FAIL. Run it with
``make bench`` or::

    .venv/bin/python bench/storm.py --hosts 1000
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Sequence

from benchkit import report, target
from benchkit.cloud import CloudShape, bench_cloud

COUNTER = "keel_min_service_version_queries"
#: keel's default KEEL_SERVICE_VERSION_CACHE_TTL (the bench cloud does not change it).
TTL_S = 60.0


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
        before = await cloud.conductor_counter(COUNTER)
        launched = time.monotonic()
        fleet = cloud.start_fleet()
        await cloud.wait_hosts_up(args.hosts, args.timeout)
        elapsed = time.monotonic() - launched
        after = await cloud.conductor_counter(COUNTER)
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
        windows = math.ceil(elapsed / TTL_S)
        worst = 0.0
        for labels in sorted(after):
            queries = after[labels] - before.get(labels, 0.0)
            worst = max(worst, queries / windows)
            report(
                "storm min-version",
                {"binary": labels.strip("{}").removeprefix("binary=").strip('"'),
                 "queries": queries, "ttl_windows": windows, "per_ttl": queries / windows},
            )  # fmt: skip
        if args.hosts >= 1000:
            target("storm: 1,000 agents all up", elapsed, at_most=30, unit=" s")
        target("storm: min-version queries per binary per TTL", worst, at_most=1)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
