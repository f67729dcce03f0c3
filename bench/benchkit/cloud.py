"""A real keel cloud for a benchmark: the console scripts as processes, on a scratch database.

:func:`bench_cloud` creates a fresh database with the ``cirros`` image, picks an exchange
nobody else uses, and starts what :class:`CloudShape` asks for: keel-conductor(s),
keel-scheduler(s) and keel-api(s) from their console scripts, and ``hosts`` compute
agents in one ``keel-fleet`` process. By default it uses the machine's PostgreSQL and
RabbitMQ; a benchmark of failures gives it a cluster instead (``broker`` and
``database_url``, see :mod:`benchkit.ha`). :meth:`Cloud.start_fleet` starts the fleet and
:meth:`Cloud.wait_hosts_up` times how long until every agent is up (the storm).
On the way out every process gets SIGTERM, then SIGKILL after a bounded wait, the
broker's exchanges and queues are deleted and the database is dropped.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from benchkit.db import DEFAULT_PG_SERVER, scratch_database
from devkit import CIRROS_ID
from devkit.broker import BrokerNotAnswering, remove_exchange, wait_for_broker
from devkit.environment import keel_env
from devkit.processes import Process, ProcessGroup
from devkit.readiness import api_answers, free_port
from devkit.servers import amqp_url
from shared.config import DatabaseSettings
from shared.db import images
from shared.db.pool import create_pool

__all__ = [
    "AMQP_URL",
    "CIRROS_ID",
    "Broker",
    "Cloud",
    "CloudError",
    "CloudShape",
    "bench_cloud",
]

AMQP_URL = amqp_url("KEEL_BENCH_AMQP")
ADMIN = {"user_id": "bench-admin", "project_id": "bench-project", "roles": ["admin", "member"]}
STOP_TIMEOUT = 30.0
DELETE_CHANNELS = 32
#: Seconds the broker gets to delete a cloud's queues; unused, they expire anyway. A
#: thousand quorum queues take the broker about a minute; the next benchmark should not
#: start while it is still at it.
CLEANUP_TIMEOUT = 300.0
#: Seconds to wait for the broker to answer before a benchmark starts its processes.
BROKER_READY_TIMEOUT = 300.0
QUEUE_EXPIRES = 120


class CloudError(Exception):
    """The cloud did not come up; the message carries the processes' log tails."""


@dataclass(frozen=True)
class Broker:
    """Where the cloud's processes reach RabbitMQ (``url``, every node of a cluster),
    and the one node the harness itself uses to wait for it and to clean up."""

    url: str = AMQP_URL
    admin_url: str = AMQP_URL


@dataclass(frozen=True)
class CloudShape:
    hosts: int = 10
    vcpus: int = 64
    memory_mb: int = 256 * 1024
    local_gb: int = 4096
    api: bool = True
    #: keel-api processes (``api``, ``api2``, …), each on its own port.
    apis: int = 1
    #: keel-conductor processes (``conductor``, ``conductor2``, …).
    conductors: int = 1
    schedulers: int = 1
    report_interval: float = 10.0
    service_down_time: float = 60.0
    #: Agents starting at once in the fleet (``0``: all of them).
    start_concurrency: int = 100
    log_level: str = "WARNING"
    #: ``KEEL_*`` settings added to every process's environment.
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclass
class Cloud:
    shape: CloudShape
    workdir: Path
    database_url: str
    exchange: str
    api_url: str
    token: str
    pool: asyncpg.Pool
    group: ProcessGroup
    #: Where keel-conductor serves its Prometheus metrics.
    conductor_metrics: str = ""
    broker: Broker = Broker()
    #: Every keel-api's URL, ``api_url`` first.
    api_urls: tuple[str, ...] = ()

    @property
    def processes(self) -> dict[str, Process]:
        return self.group.processes

    def env(self) -> dict[str, str]:
        shape = self.shape
        return keel_env(
            database_url=self.database_url,
            transport_url=self.broker.url,
            exchange=self.exchange,
            api_bind=self.api_url.removeprefix("http://"),
            tokens={self.token: ADMIN},
            host="bench-controller",
            report_interval=shape.report_interval,
            service_down_time=shape.service_down_time,
            queue_expires=QUEUE_EXPIRES,
            connect_timeout=30,
            log_level=shape.log_level,
            extra={
                "KEEL_STATE_DIR": str(self.workdir / "state"),
                "KEEL_NETWORK__CIDR": "10.128.0.0/12",
                **dict(shape.extra_env),
            },
        )

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        return self.group.start(name, argv, env or self.env())

    def start_fleet(
        self,
        hosts: int | None = None,
        *,
        name: str = "fleet",
        prefix: str = "sim",
        per_connection: int = 100,
    ) -> Process:
        shape = self.shape
        count = shape.hosts if hosts is None else hosts
        at_once = shape.start_concurrency or count
        return self.start(
            name,
            ["keel-fleet", "--hosts", str(count), "--prefix", prefix,
             "--vcpus", str(shape.vcpus), "--memory-mb", str(shape.memory_mb),
             "--local-gb", str(shape.local_gb), "--start-concurrency", str(at_once),
             "--agents-per-connection", str(per_connection)],
        )  # fmt: skip

    def start_agent(self, host: str) -> Process:
        """One keel-compute process with the fake driver, as on a real compute host."""
        shape = self.shape
        env = {
            **self.env(),
            "KEEL_HOST": host,
            "KEEL_STATE_DIR": str(self.workdir / "state" / host),
            "KEEL_COMPUTE__DRIVER": "fake",
            "KEEL_COMPUTE__VCPUS": str(shape.vcpus),
            "KEEL_COMPUTE__MEMORY_MB": str(shape.memory_mb),
            "KEEL_COMPUTE__LOCAL_GB": str(shape.local_gb),
        }
        return self.start(host, ["keel-compute"], env)

    def check_alive(self) -> None:
        dead = self.group.dead()
        if dead:
            raise CloudError(
                "\n".join(f"{p.name} exited ({p.popen.returncode}):\n{p.tail()}" for p in dead)
            )

    async def up_count(self, binary: str = "keel-compute") -> int:
        async with self.pool.acquire() as conn:
            count: int = await conn.fetchval(
                """SELECT count(*) FROM services
                    WHERE "binary" = $1 AND deleted_at IS NULL AND NOT forced_down
                      AND last_seen_up > now() - make_interval(secs => $2)""",
                binary,
                self.shape.service_down_time,
            )
        return count

    async def wait_hosts_up(self, hosts: int, timeout: float) -> float:
        """Seconds until ``hosts`` compute services are up; CloudError after ``timeout``."""
        started = time.monotonic()
        while await self.up_count() < hosts:
            self.check_alive()
            if time.monotonic() - started > timeout:
                raise CloudError(f"only {await self.up_count()} of {hosts} hosts up after "
                                 f"{timeout:g}s\n" + self.tails())  # fmt: skip
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    async def wait_control_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            shape = self.shape
            ready = (
                await self.up_count("keel-conductor") >= shape.conductors
                and await self.up_count("keel-scheduler") >= shape.schedulers
            )
            if ready and all([await asyncio.to_thread(api_answers, u) for u in self.api_urls]):
                return
            if time.monotonic() > deadline:
                raise CloudError("control services not ready\n" + self.tails())
            await asyncio.sleep(0.2)

    def tails(self) -> str:
        return self.group.describe(lines=30)

    def stop_all(self) -> None:
        self.group.stop_all()

    async def conductor_counter(self, name: str) -> dict[str, float]:
        """A counter of keel-conductor's metrics: its value per label set, as text."""
        async with httpx.AsyncClient(timeout=10) as http:
            text = (await http.get(f"http://{self.conductor_metrics}/metrics")).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(f"{name}_total"):
                labels, _, value = line.rpartition(" ")
                values[labels.removeprefix(f"{name}_total")] = float(value)
        return values

    async def topics(self) -> list[str]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("""SELECT uuid FROM services WHERE "binary" = 'keel-compute'""")
        return ["conductor", "scheduler", *(f"compute.{row['uuid']}" for row in rows)]


def machine_cpu_seconds() -> tuple[float, float]:
    """Busy and total CPU seconds of the whole machine so far, from ``/proc/stat``."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(value) for value in first]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    hertz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hertz, sum(ticks) / hertz


def _uid_of(user: str) -> int:
    """The user's id; -1 (no process's) if there is no such user."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return -1


def server_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by the PostgreSQL and RabbitMQ servers on this machine.

    PostgreSQL's includes the backends that already exited (the postmaster's reaped
    children); RabbitMQ is the ``beam.smp`` of the ``rabbitmq`` user — the machine's
    server, not the cluster nodes tests start as root. Read from ``/proc``; 0 for one not
    found.
    """
    hertz = os.sysconf("SC_CLK_TCK")
    broker_uid = _uid_of("rabbitmq")
    used = {"postgresql": 0.0, "rabbitmq": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            owner = entry.stat().st_uid
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        own = int(fields[11]) + int(fields[12])
        if name == "beam.smp" and owner == broker_uid:
            used["rabbitmq"] += own / hertz
        elif name.startswith("postgres"):
            # The postmaster (a daemon: its parent is init) also carries its reaped
            # backends; a live backend counts itself.
            reaped = int(fields[13]) + int(fields[14]) if fields[1] == "1" else 0
            used["postgresql"] += (own + reaped) / hertz
    return used


def _numbered(name: str, number: int) -> str:
    """``conductor``, ``conductor2``, …: the first keeps the plain name."""
    return name if number == 1 else f"{name}{number}"


def start_control(cloud: Cloud) -> None:
    """Start the conductors, schedulers and APIs the shape asks for."""
    shape = cloud.shape
    for number in range(1, shape.conductors + 1):
        env = {**cloud.env(), "KEEL_HOST": _numbered("bench-controller", number)}
        if number == 1:
            env["KEEL_METRICS_BIND"] = cloud.conductor_metrics
        cloud.start(_numbered("conductor", number), ["keel-conductor"], env)
    for number in range(1, shape.schedulers + 1):
        env = {**cloud.env(), "KEEL_HOST": f"bench-controller-{number}"}
        cloud.start(f"scheduler{number}", ["keel-scheduler"], env)
    for number, url in enumerate(cloud.api_urls, start=1):
        env = {**cloud.env(), "KEEL_API_BIND": url.removeprefix("http://")}
        cloud.start(_numbered("api", number), ["keel-api"], env)


@asynccontextmanager
async def _database(pg_server: str, database_url: str | None) -> AsyncIterator[str]:
    if database_url is not None:
        yield database_url
        return
    async with scratch_database(pg_server) as url:
        yield url


@asynccontextmanager
async def bench_cloud(
    shape: CloudShape,
    pg_server: str = DEFAULT_PG_SERVER,
    *,
    broker: Broker | None = None,
    database_url: str | None = None,
) -> AsyncIterator[Cloud]:
    """Database, conductor(s), scheduler(s) and API(s) running; the fleet is the caller's
    to start. ``database_url``: a migrated database the caller owns, instead of a
    scratch one on ``pg_server``."""
    broker = broker or Broker()
    try:
        waited = await wait_for_broker(BROKER_READY_TIMEOUT, url=broker.admin_url)
    except BrokerNotAnswering as exc:
        raise CloudError(str(exc)) from None
    if waited > 5:
        print(f"RabbitMQ answered after {waited:.0f}s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as workdir:
        async with _database(pg_server, database_url) as url:
            pool = await create_pool(url, DatabaseSettings(pool_max_size=4, connect_timeout=5))
            api_urls = tuple(
                f"http://127.0.0.1:{free_port()}" for _ in range(shape.apis if shape.api else 0)
            )
            cloud = Cloud(
                shape=shape,
                workdir=Path(workdir),
                database_url=url,
                exchange=f"keel-bench-{uuid.uuid4().hex[:12]}",
                api_url=api_urls[0] if api_urls else f"http://127.0.0.1:{free_port()}",
                token=f"bench-{uuid.uuid4().hex}",
                pool=pool,
                group=ProcessGroup(Path(workdir) / "logs", stop_timeout=STOP_TIMEOUT),
                broker=broker,
                api_urls=api_urls,
                conductor_metrics=f"127.0.0.1:{free_port()}",
            )
            topics: list[str] = ["conductor", "scheduler"]
            try:
                async with pool.acquire() as conn:
                    await images.create(conn, image_id=CIRROS_ID, name="cirros", min_disk=1)
                start_control(cloud)
                await cloud.wait_control_up()
                yield cloud
            finally:
                try:
                    topics = await cloud.topics()
                finally:
                    began = time.monotonic()
                    await asyncio.to_thread(cloud.stop_all)
                    stopped = time.monotonic()
                    await pool.close()
                    try:
                        async with asyncio.timeout(CLEANUP_TIMEOUT):
                            took = await remove_exchange(
                                cloud.exchange,
                                topics,
                                url=broker.admin_url,
                                channels=DELETE_CHANNELS,
                            )
                        print(f"deleted {len(topics)} queues in {took:.1f}s", file=sys.stderr)
                    except TimeoutError:
                        print(f"the broker did not delete the queues within {CLEANUP_TIMEOUT:g}s; "
                              f"unused, they expire by themselves after {QUEUE_EXPIRES}s",
                              file=sys.stderr)  # fmt: skip
                    print(f"teardown: processes {stopped - began:.1f}s, broker "
                          f"{time.monotonic() - stopped:.1f}s", file=sys.stderr)  # fmt: skip
