"""Faults during boot-and-delete: keel on a RabbitMQ cluster and a PostgreSQL primary with
a standby, measured as OpenStack's reliability test plans measure Nova.

What is measured: for each fault, a fresh keel cloud (two keel-conductors, two
keel-schedulers, two keel-apis, agents with the local driver: :mod:`benchkit.ha`) on a
three-node RabbitMQ cluster and a PostgreSQL primary with a synchronous standby under
Patroni (:mod:`devkit.pg_cluster`), all started here on their own ports and directories
and shared by the faults (each waits until every node is back and replicating).
``--clients`` clients run Rally's boot-and-delete against both APIs
(:mod:`benchkit.clients`) for ``--before`` seconds, then the fault is injected, and the
clients go on for ``--after`` seconds after it ended. Per fault
(:mod:`benchkit.timeline`, :mod:`benchkit.outcome`): downtime (seconds during which
requests failed), MTTR (seconds until boot-and-delete is back within 1.5x its median
before the fault), servers lost or duplicated, tasks left stuck, and keel processes that
exited though nobody killed them. No keel process is restarted.

The faults:

* ``broker-kill`` — SIGKILL the RabbitMQ node leading the conductor queue;
* ``broker-rolling-restart`` — stop and start each node in turn, waiting until every
  quorum queue keeps a majority without the next one (``rabbitmq-upgrade
  await_online_quorum_plus_one``), as a rolling upgrade does;
* ``broker-pause`` — freeze the node leading the conductor queue (SIGSTOP) for longer
  than the distribution tick: the others count it out, and on waking it finds itself in
  the minority and pauses (``pause_minority``) until it sees them again;
* ``db-failover`` — SIGKILL the PostgreSQL primary's postmaster and backends; Patroni
  (with etcd) promotes the synchronous standby on its own, and brings the old primary
  back as its standby;
* ``kill-conductor``, ``kill-scheduler``, ``kill-api`` — SIGKILL one of the two.

Targets (printed PASS/FAIL, never enforced): downtime <= 5 s, MTTR <= 30 s, nothing lost,
duplicated or stuck, no process restarted. Run it with::

    .venv/bin/python bench/faults.py                      # every fault
    .venv/bin/python bench/faults.py --faults db-failover --clients 4 --before 10 --after 20
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from benchkit import report, target
from benchkit.clients import BootAndDelete
from benchkit.ha import Stage, StageShape, ha_stage, keep_logs
from benchkit.outcome import outcome
from benchkit.timeline import timeline

from devkit.pg_cluster import PgCluster, pg_cluster
from devkit.rabbit_cluster import RabbitCluster, rabbit_cluster

#: Seconds a paused node stays frozen (the distribution tick is 6 s).
PAUSE_S = 20.0


@dataclass(frozen=True)
class Injected:
    """What a fault did: a line for the report, and the keel processes it killed."""

    what: str
    killed: frozenset[str] = frozenset()


Fault = Callable[[Stage], Awaitable[Injected]]


async def broker_kill(stage: Stage) -> Injected:
    leader = await stage.rabbit.leader(f"{stage.cloud.exchange}.conductor")
    await stage.rabbit.kill(leader)
    return Injected(f"SIGKILL {leader.label}, leader of the conductor queue")


async def broker_rolling_restart(stage: Stage) -> Injected:
    rabbit = stage.rabbit
    for node in rabbit.nodes:
        await rabbit.await_quorum_plus_one(node)
        await rabbit.restart(node)
    return Injected("restarted " + ", ".join(node.label for node in rabbit.nodes) + " in turn")


async def broker_pause(stage: Stage) -> Injected:
    leader = await stage.rabbit.leader(f"{stage.cloud.exchange}.conductor")
    await stage.rabbit.pause(leader, PAUSE_S)
    return Injected(f"froze {leader.label}, leader of the conductor queue, for {PAUSE_S:g}s")


async def db_failover(stage: Stage) -> Injected:
    old = stage.pg.primary.name
    stage.pg.kill_primary()
    took = await stage.pg.await_failover()
    return Injected(
        f"SIGKILL the primary ({old}); Patroni promoted {stage.pg.primary.name} {took:.1f}s later"
    )


def kill(name: str) -> Fault:
    async def fault(stage: Stage) -> Injected:
        stage.cloud.processes[name].popen.send_signal(signal.SIGKILL)
        return Injected(f"SIGKILL {name}", frozenset({name}))

    return fault


FAULTS: dict[str, Fault] = {
    "broker-kill": broker_kill,
    "broker-rolling-restart": broker_rolling_restart,
    "broker-pause": broker_pause,
    "db-failover": db_failover,
    "kill-conductor": kill("conductor2"),
    "kill-scheduler": kill("scheduler2"),
    "kill-api": kill("api2"),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}"
    )
    parser.add_argument("--clients", type=int, default=10, help="boot-and-delete clients")
    parser.add_argument("--hosts", type=int, default=4, help="compute agents")
    parser.add_argument("--before", type=float, default=30.0, help="seconds before the fault")
    parser.add_argument("--after", type=float, default=60.0, help="seconds after it ended")
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the keel processes' logs of every fault (kept anyway when one went wrong)",
    )
    args = parser.parse_args(argv)
    args.faults = [name.strip() for name in args.faults.split(",") if name.strip()]
    unknown = sorted(set(args.faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    if args.clients < 1 or args.hosts < 1:
        parser.error("--clients and --hosts must be at least 1")
    return args


async def measure(
    name: str, rabbit: RabbitCluster, pg: PgCluster, args: argparse.Namespace
) -> None:
    async with ha_stage(rabbit, pg, StageShape(hosts=args.hosts)) as stage:
        pids = stage.pids()
        cloud = stage.cloud
        clients = BootAndDelete(cloud.api_urls, cloud.token, args.clients)
        running = asyncio.create_task(clients.run())
        await asyncio.sleep(args.before)
        fault_at = clients.clock()
        injected = await FAULTS[name](stage)
        fault_took = clients.clock() - fault_at
        await asyncio.sleep(args.after)
        clients.stop()
        await running
        seen = timeline(clients.iterations, clients.probes, fault_at, window=args.clients)
        result = await outcome(stage, clients.accepted, deleted=frozenset(clients.deleted))
        restarted = stage.restarted_or_dead(pids, killed=set(injected.killed))
        if args.keep_logs or restarted or not result.whole:
            keep_logs(cloud)
    report(
        name,
        {
            **seen.figures(),
            **result.figures(),
            "fault_s": round(fault_took, 1),
            "unplanned_exits": ",".join(restarted) or "none",
            "fault": injected.what,
        },
    )
    target(f"{name} downtime", seen.downtime, at_most=5.0, unit="s")
    target(f"{name} MTTR", seen.mttr, at_most=30.0, unit="s")
    target(f"{name} lost+duplicated+stuck", result.lost + result.duplicated + result.stuck,
           at_most=0)  # fmt: skip
    target(f"{name} processes that exited", len(restarted), at_most=0)


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    async with rabbit_cluster(3) as rabbit, pg_cluster() as pg:
        print(
            f"RabbitMQ cluster and PostgreSQL pair up in {time.monotonic() - began:.0f}s",
            file=sys.stderr,
        )
        for name in args.faults:
            await rabbit.all_running()
            await pg.await_synchronous()
            await measure(name, rabbit, pg, args)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
