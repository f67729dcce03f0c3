"""A keel cloud on real clusters, to break: what the fault benchmark and the HA tests run.

:func:`ha_stage` takes a three-node RabbitMQ cluster (:mod:`devkit.rabbit_cluster`) and a
PostgreSQL primary with a synchronous standby (:mod:`devkit.pg_cluster`), makes and
migrates a database on them, and starts the benchmark cloud (:func:`benchkit.cloud.
bench_cloud`) with every process given all three broker nodes and both database
servers (``target_session_attrs=read-write``): two keel-conductors, two keel-schedulers,
two keel-apis, and ``hosts`` keel-compute agents with the local driver, whose guests are
directories an outsider can count (:meth:`Stage.guests`).

AMQP heartbeats are short (``heartbeat=2``: a node that froze is noticed within about
nine seconds); everything else is keel's defaults.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import asyncpg

from benchkit.cloud import Broker, Cloud, CloudShape, bench_cloud
from devkit.pg_cluster import PgCluster
from devkit.rabbit_cluster import RabbitCluster
from shared.db import schema

AGENT_PREFIX = "ha"
#: The local driver keeps each guest in ``<state dir>/instances/<uuid>/``.
GUESTS_DIR = "instances"


@dataclass(frozen=True)
class StageShape:
    hosts: int = 4
    conductors: int = 2
    schedulers: int = 2
    apis: int = 2
    vcpus: int = 64
    memory_mb: int = 65536
    local_gb: int = 2000
    #: AMQP heartbeat, seconds.
    heartbeat: int = 2
    log_level: str = "INFO"


@dataclass
class Stage:
    cloud: Cloud
    rabbit: RabbitCluster
    pg: PgCluster
    hosts: tuple[str, ...]

    def pids(self) -> dict[str, int]:
        """Every keel process's pid, by name."""
        return {name: p.popen.pid for name, p in self.cloud.processes.items()}

    def restarted_or_dead(self, pids: dict[str, int], *, killed: set[str]) -> list[str]:
        """Processes (other than those ``killed`` on purpose) that exited or were
        replaced since ``pids`` was taken."""
        return [
            name
            for name, process in self.cloud.processes.items()
            if name not in killed
            and (process.exit_code() is not None or process.popen.pid != pids.get(name))
        ]

    def guests(self) -> dict[UUID, list[str]]:
        """The hosts holding a guest, by instance: what the hypervisors hold."""
        found: dict[UUID, list[str]] = {}
        for host in self.hosts:
            directory = self.state_dir(host) / GUESTS_DIR
            if not directory.is_dir():
                continue
            for entry in directory.iterdir():
                try:
                    instance = UUID(entry.name)
                except ValueError:
                    continue  # a guest being built or removed
                found.setdefault(instance, []).append(host)
        return found

    def state_dir(self, host: str) -> Path:
        return self.cloud.workdir / "state" / host

    async def queue_leader(self, topic: str) -> str:
        """The RabbitMQ node leading ``topic``'s queue (``rabbit<n>``)."""
        queue = f"{self.cloud.exchange}.{topic}"
        return (await self.rabbit.leader(queue)).label


def keep_logs(cloud: Cloud) -> Path:
    """Copy the keel processes' logs out of the cloud's directory, which goes with it."""
    kept = Path(tempfile.gettempdir()) / f"{cloud.exchange}-logs"
    shutil.copytree(cloud.workdir / "logs", kept, dirs_exist_ok=True)
    print(f"the keel processes' logs are kept in {kept}", file=sys.stderr)
    return kept


async def migrated_database(pg: PgCluster) -> str:
    """A new keel database on the cluster's primary, migrated; its URL (both servers)."""
    url = await pg.create_database(f"keel_ha_{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(url)
    try:
        await schema.sync(conn)
    finally:
        await conn.close()
    return url


def _agent_env(cloud: Cloud, shape: StageShape, host: str, state_dir: Path) -> dict[str, str]:
    return {
        **cloud.env(),
        "KEEL_HOST": host,
        "KEEL_STATE_DIR": str(state_dir),
        "KEEL_COMPUTE__DRIVER": "local",
        "KEEL_COMPUTE__VCPUS": str(shape.vcpus),
        "KEEL_COMPUTE__MEMORY_MB": str(shape.memory_mb),
        "KEEL_COMPUTE__LOCAL_GB": str(shape.local_gb),
    }


@asynccontextmanager
async def ha_stage(
    rabbit: RabbitCluster, pg: PgCluster, shape: StageShape = StageShape()
) -> AsyncIterator[Stage]:
    """The cloud on both clusters, every agent up; see the module docstring.

    On the way out every RabbitMQ node is started again if a fault left it down, so the
    benchmark cloud can remove its queues.
    """
    database_url = await migrated_database(pg)
    broker = Broker(
        url=rabbit.url(query=f"heartbeat={shape.heartbeat}"),
        admin_url=rabbit.node_url(rabbit.nodes[0]),
    )
    cloud_shape = CloudShape(
        hosts=shape.hosts,
        vcpus=shape.vcpus,
        memory_mb=shape.memory_mb,
        local_gb=shape.local_gb,
        apis=shape.apis,
        conductors=shape.conductors,
        schedulers=shape.schedulers,
        report_interval=1.0,
        service_down_time=10.0,
        log_level=shape.log_level,
        # The clients' servers are many; quotas are not what is measured.
        extra_env=(
            ("KEEL_QUOTA__INSTANCES", "-1"),
            ("KEEL_QUOTA__CORES", "-1"),
            ("KEEL_QUOTA__RAM", "-1"),
        ),
    )
    async with bench_cloud(cloud_shape, broker=broker, database_url=database_url) as cloud:
        try:
            hosts = tuple(f"{AGENT_PREFIX}-{index}" for index in range(1, shape.hosts + 1))
            for host in hosts:
                state = cloud.workdir / "state" / host
                state.mkdir(parents=True, exist_ok=True)
                cloud.start(host, ["keel-compute"], _agent_env(cloud, shape, host, state))
            await cloud.wait_hosts_up(len(hosts), timeout=180)
            yield Stage(cloud=cloud, rabbit=rabbit, pg=pg, hosts=hosts)
        except BaseException:
            keep_logs(cloud)
            raise
        finally:
            await rabbit.all_running()
