"""keel-fleet: N simulated compute agents in one process (console script ``keel-fleet``).

For operators rehearsing scale and for keel's benchmarks: every agent is a full
keel-compute with a fake driver (see :mod:`services.compute.fleet`). Settings come from
the environment and ``--config`` as for keel-compute (broker, exchange, report interval,
allocation ratios, zone…); the options below say how many agents, their names, sizes and
where their identity files live. SIGTERM or SIGINT stops them all and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

from services.compute.fleet import Fleet, FleetSpec
from shared.config import Settings, add_config_argument
from shared.runtime import Lifecycle, run

LOG = logging.getLogger(__name__)

DESCRIPTION = "Run many simulated compute agents (fake driver) in one process."


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keel-fleet", description=DESCRIPTION)
    add_config_argument(parser)
    defaults = FleetSpec(hosts=1)
    parser.add_argument("--hosts", type=int, required=True, help="agents to run")
    parser.add_argument(
        "--prefix", default=defaults.prefix, help="host names are PREFIX-00001 … (default sim)"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="each agent keeps its identity in STATE_DIR/<host>/ (default: KEEL_STATE_DIR)",
    )
    parser.add_argument("--vcpus", type=int, default=defaults.vcpus, help="vCPUs per host")
    parser.add_argument(
        "--memory-mb", type=int, default=defaults.memory_mb, help="memory (MB) per host"
    )
    parser.add_argument("--local-gb", type=int, default=defaults.local_gb, help="disk per host")
    parser.add_argument(
        "--agents-per-connection",
        type=int,
        default=defaults.agents_per_connection,
        help="agents sharing one broker connection (default 100)",
    )
    parser.add_argument(
        "--start-concurrency",
        type=int,
        default=defaults.start_concurrency,
        help="agents starting at once (default 100; as many as --hosts for a storm)",
    )
    return parser


def fleet_spec(args: argparse.Namespace) -> FleetSpec:
    return FleetSpec(
        hosts=args.hosts,
        prefix=args.prefix,
        state_dir=args.state_dir,
        vcpus=args.vcpus,
        memory_mb=args.memory_mb,
        local_gb=args.local_gb,
        agents_per_connection=args.agents_per_connection,
        start_concurrency=args.start_concurrency,
    )


async def _started_unless_stopped(fleet: Fleet, lifecycle: Lifecycle) -> bool:
    """Start the fleet; False if asked to stop first (start-up is then cancelled)."""
    starting = asyncio.create_task(fleet.start())
    stopping = asyncio.create_task(lifecycle.stopping.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        starting.result()
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    LOG.info("stopped before every agent had started")
    return False


def main(argv: Sequence[str] | None = None) -> None:
    options = parser()
    args = options.parse_args(argv)
    counts = (args.hosts, args.vcpus, args.memory_mb, args.local_gb)
    if min(*counts, args.agents_per_connection, args.start_concurrency) < 1:
        options.error("every count and size must be at least 1")
    spec = fleet_spec(args)

    async def serve(settings: Settings, lifecycle: Lifecycle) -> None:
        fleet = Fleet(settings, spec)
        try:
            if await _started_unless_stopped(fleet, lifecycle):
                await lifecycle.stopping.wait()
        finally:
            await fleet.stop()

    run("keel-fleet", serve, ["--config", str(args.config)] if args.config else [], DESCRIPTION)
