"""Rally's ``NovaServers.boot_and_delete_server`` against keel and against Nova, alternating.

The same Rally task as ``bench/rally.py`` (``--times`` iterations at ``--concurrency``,
``users`` context, ``m1.tiny``, image ``cirros``) runs against a keel cloud
(``benchkit.cloud.bench_cloud``: keel-api, keel-conductor, keel-scheduler and a
``keel-fleet`` of ``--hosts`` simulated hosts, embedded identity) and, with ``--nova``,
against a Nova control plane stood up on this machine (:mod:`benchkit.nova`: Keystone,
Glance, Placement, nova-api, nova-conductor, nova-scheduler and ``--hosts`` nova-compute
processes with the fake driver, on fresh MariaDB databases and a RabbitMQ virtual host of
its own, no Neutron). ``--rounds`` rounds, each keel then Nova, every cloud new and taken
down again before the next one starts, so the two share the same minutes and never run
at once.

For each run: Rally's figures (success, iteration p50/p90/p99, boot and delete p50/p99)
and the CPU time (user + system, from ``/proc``) of the control plane's own processes
and everything they started, from just before ``rally task start`` until it returns
(Rally's ``users`` context and cleanup included), per iteration; then with its database
(PostgreSQL for keel, MariaDB for Nova) and the broker (RabbitMQ's ``beam.smp``) added.
Those two servers are the machine's, shared with whatever else runs: their figures are
as clean as the machine is quiet. Last, the ratios Nova / keel of the medians and of the
CPU per iteration (medians over the rounds).

Install (``make rally-nova`` does all of it, then runs 200 iterations at concurrency 20)::

    python3 -m venv .rally-venv && .rally-venv/bin/pip install -r bench/rally-requirements.txt
    python3 -m venv .nova-venv && .nova-venv/bin/pip install -r bench/nova-requirements.txt
    .venv/bin/python bench/rally_nova.py --nova --times 200 --concurrency 20

Nova's side needs MariaDB on 127.0.0.1:3306 (``root``, no password) with its ``mysql``
client, and RabbitMQ's management API on port 15672 (to make the virtual host).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchkit import report
from benchkit.cloud import CloudShape, bench_cloud
from benchkit.nova import NovaCloud, nova_cloud
from rally import UNLIMITED_QUOTAS, Rally, environment, figures, identity_url, make_admin, run_task

from devkit.processes import Process

HERTZ = os.sysconf("SC_CLK_TCK")
#: The user the machine's RabbitMQ runs as (Debian's package), -1 where there is none.
RABBITMQ_UID = next((u.pw_uid for u in pwd.getpwall() if u.pw_name == "rabbitmq"), -1)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        epilog=__doc__.split("Install", 1)[1].join(("Install", "")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nova", action="store_true", help="run against Nova too, alternating")
    parser.add_argument("--times", type=int, default=10, help="iterations (10)")
    parser.add_argument("--concurrency", type=int, default=2, help="iterations at once (2)")
    parser.add_argument("--rounds", type=int, default=1, help="keel-then-Nova rounds (1)")
    parser.add_argument("--tenants", type=int, default=3, help="projects Rally creates (3)")
    parser.add_argument("--users-per-tenant", type=int, default=2, help="users in each (2)")
    parser.add_argument("--hosts", type=int, default=10, help="compute hosts of each (10)")
    parser.add_argument("--venv", default=".rally-venv", help="Rally's virtualenv")
    parser.add_argument("--nova-venv", default=".nova-venv", help="Nova's virtualenv")
    parser.add_argument("--workdir", default=".rally-nova", help="logs, Rally's files")
    args = parser.parse_args(argv)
    args.venv, args.nova_venv = Path(args.venv).absolute(), Path(args.nova_venv).absolute()
    args.workdir = Path(args.workdir).absolute()
    return args


# CPU time from /proc.


@dataclass
class Stat:
    pid: int
    name: str
    ppid: int
    session: int
    own: int  #: utime + stime, in ticks
    reaped: int  #: cutime + cstime: its children that exited and were waited for


def stats() -> list[Stat]:
    """Every process of the machine, from ``/proc/<pid>/stat`` (see proc(5))."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text.rpartition(")")[2].split()
        found.append(
            Stat(
                pid=int(entry.name),
                name=text[text.index("(") + 1 : text.rindex(")")],
                ppid=int(fields[1]),
                session=int(fields[3]),
                own=int(fields[11]) + int(fields[12]),
                reaped=int(fields[13]) + int(fields[14]),
            )
        )
    return found


def serves(stat: Stat, database: str) -> bool:
    """Whether ``stat`` is a PostgreSQL backend connected to ``database``: its command
    line reads ``postgres: <cluster>: <user> <database> <client>``."""
    if not stat.name.startswith("postgres"):
        return False
    try:
        line = Path(f"/proc/{stat.pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return f" {database} " in line.replace("\0", " ")


def is_machine_broker(stat: Stat) -> bool:
    """The machine's RabbitMQ: a ``beam.smp`` of the ``rabbitmq`` user (tests start
    nodes of their own, as root, that are none of this run's business)."""
    if stat.name != "beam.smp":
        return False
    try:
        return Path(f"/proc/{stat.pid}").stat().st_uid == RABBITMQ_UID
    except OSError:
        return False


@dataclass
class Snapshot:
    """CPU seconds so far of each process of a cloud (with all it started: its session),
    of its database and of the broker.

    keel's database is the PostgreSQL backends connected to its scratch database (the
    server's shared background processes are left out: other databases use them too);
    Nova's is the whole MariaDB server, which nothing else here uses. The broker is
    RabbitMQ's ``beam.smp``, shared with whatever else runs on the machine.
    """

    processes: dict[str, float] = field(default_factory=dict)
    database: float = 0.0
    broker: float = 0.0

    @classmethod
    def take(cls, processes: dict[str, Process], database: str | None) -> Snapshot:
        """``database``: keel's PostgreSQL database, or None for Nova's MariaDB."""
        found = stats()
        by_session: dict[int, int] = {}
        for stat in found:
            by_session[stat.session] = by_session.get(stat.session, 0) + stat.own + stat.reaped
        snapshot = cls()
        for name, process in processes.items():
            snapshot.processes[name] = by_session.get(process.popen.pid, 0) / HERTZ
        if database is None:
            ticks = sum(stat.own for stat in found if stat.name == "mariadbd")
        else:
            ticks = sum(stat.own for stat in found if serves(stat, database))
        snapshot.database = ticks / HERTZ
        snapshot.broker = sum(stat.own for stat in found if is_machine_broker(stat)) / HERTZ
        return snapshot

    def minus(self, before: Snapshot) -> Snapshot:
        return Snapshot(
            {k: v - before.processes.get(k, 0.0) for k, v in self.processes.items()},
            self.database - before.database,
            self.broker - before.broker,
        )


# One run.


@dataclass
class Run:
    side: str  #: "keel" or "nova"
    round: int
    shown: dict[str, object]
    errors: list[str]
    cpu: Snapshot
    database: str

    @property
    def iterations(self) -> int:
        return max(1, int(str(self.shown["iterations"])))

    def per_iteration_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.iterations

    def figures(self, grouping: Callable[[str], str]) -> dict[str, object]:
        """Rally's figures, then CPU ms per iteration: each group of processes, the
        control plane, with the database, with the broker too."""
        groups: dict[str, float] = {}
        for name, seconds in self.cpu.processes.items():
            groups[grouping(name)] = groups.get(grouping(name), 0.0) + seconds
        own = sum(seconds for name, seconds in groups.items() if name != "network-stub")
        database, broker = self.cpu.database, self.cpu.broker
        return {
            **self.shown,
            **{f"{name}_cpu_ms": self.per_iteration_ms(s) for name, s in groups.items()},
            "control_cpu_ms": self.per_iteration_ms(own),
            **(
                {"control_but_keystone_cpu_ms": self.per_iteration_ms(own - groups["keystone"])}
                if "keystone" in groups
                else {}
            ),
            f"with_{self.database}_cpu_ms": self.per_iteration_ms(own + database),
            "with_db_and_broker_cpu_ms": self.per_iteration_ms(own + database + broker),
        }


def keel_group(name: str) -> str:
    return name


def nova_group(name: str) -> str:
    """The nova-compute processes (``fake-000``, …) as one figure."""
    return "nova-compute" if name.startswith("fake-") else name


def rally_in(args: argparse.Namespace, label: str) -> Rally:
    workdir = args.workdir / label
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    return Rally(args.venv, workdir)


async def run_keel(args: argparse.Namespace, number: int) -> Run:
    password = secrets.token_urlsafe(18)
    shape = CloudShape(hosts=args.hosts, extra_env=UNLIMITED_QUOTAS)
    async with bench_cloud(shape) as cloud:
        cloud.start_fleet()
        await cloud.wait_hosts_up(args.hosts, timeout=120)
        await make_admin(cloud, password)
        rally = rally_in(args, f"keel-{number}")
        spec = environment(identity_url(cloud), password)
        database = cloud.database_url.rpartition("/")[2]
        before = Snapshot.take(cloud.processes, database)
        report_file = await asyncio.to_thread(run_task, rally, spec, args, "keel")
        cpu = Snapshot.take(cloud.processes, database).minus(before)
    shown, errors = figures(report_file)
    return Run("keel", number, shown, errors, cpu, "postgresql")


def run_nova(args: argparse.Namespace, number: int) -> Run:
    began = time.monotonic()
    with nova_cloud(args.nova_venv, args.workdir / f"nova-{number}-cloud", args.hosts) as cloud:
        print(f"nova {number}: control plane up in {time.monotonic() - began:.0f} s", flush=True)
        rally = rally_in(args, f"nova-{number}")
        spec = environment(cloud.auth_url, cloud.password, admin="admin")
        before = Snapshot.take(cloud.processes, None)
        report_file = run_task(rally, spec, args, "nova")
        cpu = Snapshot.take(cloud.processes, None).minus(before)
        check_nova(cloud)
    shown, errors = figures(report_file)
    return Run("nova", number, shown, errors, cpu, "mariadb")


def check_nova(cloud: NovaCloud) -> None:
    """A process of the control plane that died during the run makes the run void."""
    dead = cloud.group.dead()
    if dead:
        names = ", ".join(p.name for p in dead)
        raise RuntimeError(f"Nova's {names} exited during the run:\n{cloud.tails()}")


# The summary.


def median_of(runs: list[Run], key: str) -> float:
    values = [float(str(run.figures(keel_group)[key])) for run in runs]
    return statistics.median(values) if values else float("nan")


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def summary(runs: list[Run]) -> dict[str, object]:
    keel = [run for run in runs if run.side == "keel"]
    nova = [run for run in runs if run.side == "nova"]
    compared: dict[str, object] = {}
    for key in ("duration_p50_s", "boot_server_p50_s", "delete_server_p50_s", "control_cpu_ms"):
        compared[f"nova/keel {key}"] = ratio(median_of(nova, key), median_of(keel, key))
    nova_all = statistics.median(
        [float(str(run.figures(nova_group)["with_db_and_broker_cpu_ms"])) for run in nova]
    )
    keel_all = median_of(keel, "with_db_and_broker_cpu_ms")
    compared["nova/keel with_db_and_broker_cpu_ms"] = ratio(nova_all, keel_all)
    return compared


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [args.venv / "bin" / "rally"]
    if args.nova:
        wanted.append(args.nova_venv / "bin" / "nova-conductor")
    missing = [str(path) for path in wanted if not path.exists()]
    if missing:
        print(f"rally_nova: {', '.join(missing)} not found: run `make rally-nova`", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    for number in range(1, args.rounds + 1):
        sides = [("keel", keel_group)] + ([("nova", nova_group)] if args.nova else [])
        for side, grouping in sides:
            if side == "keel":
                run = await run_keel(args, number)
            else:
                run = await asyncio.to_thread(run_nova, args, number)
            runs.append(run)
            report(f"rally {side} {number}", run.figures(grouping))
            for error in run.errors:
                print(f"rally {side} error: {error}", file=sys.stderr)
    if args.nova:
        report("rally nova/keel", summary(runs))
    complete = all(run.shown["failed"] == 0 and run.iterations == args.times for run in runs)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
