"""Two PostgreSQL servers under Patroni, with etcd, on this machine: a primary and a
synchronous standby that fail over without anyone's command, for the HA tests and the
fault benchmark.

Everything lives under a directory of its own, each process on free ports of 127.0.0.1
with its socket in that directory (never the machine's server on 5432 or its
``/var/run/postgresql``): a one-member etcd (:mod:`devkit.etcd_server`) and one Patroni
per server (from ``/opt/keel/patroni``, which ``deploy/dev-servers.sh`` installs; or
``KEEL_HA_PATRONI``), run as the ``postgres`` user when the tests run as root. The first
Patroni bootstraps the cluster (``initdb``) and leads it; the second clones it
(``pg_basebackup``) and streams from it.

Patroni keeps replication synchronous (``synchronous_mode``): a commit the primary
acknowledged is on the standby too, and only a synchronous standby may be promoted, so a
failover loses nothing keel was told was done. When the primary's postmaster dies, its
Patroni does not try to restart it in place (``primary_start_timeout: 0``): it gives up
the leader key within a loop (one second), the standby's Patroni takes it and promotes
its server, and the old primary comes back as a standby (``pg_rewind``). A whole node's
death (Patroni too) fails over once the leader key expires (``ttl``, 20 s).

:meth:`PgCluster.kill_primary` SIGKILLs the primary's postmaster and every backend (a
crash); :meth:`PgCluster.await_failover` waits, without doing anything, until the
standby has been promoted. :meth:`PgCluster.url` is a ``KEEL_DATABASE_URL`` naming both
servers with ``target_session_attrs=read-write``, so clients find whichever is primary.
:func:`pg_cluster` starts one and always tears it down.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from devkit.clusters import ClusterError, chown_to, free_ports, make_root, remove_root, run_as
from devkit.etcd_server import EtcdServer
from devkit.processes import Process, ProcessGroup
from devkit.readiness import wait_until

BIN_GLOB = "/usr/lib/postgresql/*/bin"
PATRONI = "/opt/keel/patroni/bin/patroni"
START_TIMEOUT = 90.0
#: Seconds a failover may take: the old primary's Patroni notices the crash within a
#: loop, the standby's promotes within the next.
FAILOVER_TIMEOUT = 60.0
#: PostgreSQL's settings on both servers: small, quick, replicating (Patroni adds what
#: replication needs, ``synchronous_standby_names`` included).
PARAMETERS = {
    "max_connections": 300,
    "shared_buffers": "32MB",
    "wal_level": "replica",
    "max_wal_senders": 5,
    "max_replication_slots": 5,
    "hot_standby": "on",
    "synchronous_commit": "on",
    "wal_keep_size": "128MB",
    "wal_log_hints": "on",
    "fsync": "off",
    "logging_collector": "off",
    "log_min_messages": "warning",
}
HBA = [
    "local all all trust",
    "host all all 127.0.0.1/32 trust",
    "host replication all 127.0.0.1/32 trust",
    "local replication all trust",
]


def bindir() -> Path:
    configured = os.environ.get("KEEL_HA_PG_BINDIR")
    if configured:
        return Path(configured)
    found = sorted(glob.glob(BIN_GLOB), key=lambda path: int(Path(path).parent.name))
    if not found:
        raise ClusterError(
            f"PostgreSQL's server binaries are not installed (no {BIN_GLOB}): "
            "apt-get install postgresql, or set KEEL_HA_PG_BINDIR"
        )
    return Path(found[-1])


def patroni_binary() -> str:
    found = os.environ.get("KEEL_HA_PATRONI", PATRONI)
    if not os.access(found, os.X_OK):
        raise ClusterError(
            f"Patroni is not installed at {found}: run deploy/dev-servers.sh as root (it "
            "installs the pinned Patroni into /opt/keel/patroni), or set KEEL_HA_PATRONI"
        )
    return found


@dataclass
class PgServer:
    #: ``pg1`` or ``pg2``: its Patroni member name.
    name: str
    port: int
    api_port: int
    data: Path
    #: Its Patroni (which runs its postmaster).
    process: Process | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.address}/{database}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.exit_code() is None

    def tail(self) -> str:
        return self.process.tail(40) if self.process is not None else "(never started)"

    def postmaster_pid(self) -> int | None:
        """The pid of its postmaster, if one runs (the first line of ``postmaster.pid``)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    async def in_recovery(self) -> bool | None:
        """Whether it is a standby; ``None`` if it does not answer."""
        try:
            conn = await asyncpg.connect(self.dsn(), timeout=3)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return None
        try:
            found: bool = await conn.fetchval("SELECT pg_is_in_recovery()")
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return None
        finally:
            with contextlib.suppress(Exception):
                await conn.close()
        return found


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: the command may hold spaces and parentheses.
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class PgCluster:
    root: Path
    group: ProcessGroup
    etcd: EtcdServer
    #: The server that is primary now, and the one that is standby now (they swap when
    #: :meth:`await_failover` sees the standby promoted).
    primary: PgServer
    standby: PgServer
    user: str | None
    scope: str

    @classmethod
    def create(cls, root: Path) -> PgCluster:
        pg1, pg2, api1, api2 = free_ports(4)
        return cls(
            root=root,
            group=ProcessGroup(root / "logs"),
            etcd=EtcdServer.create(root),
            primary=PgServer("pg1", pg1, api1, root / "pg1"),
            standby=PgServer("pg2", pg2, api2, root / "pg2"),
            user=run_as(),
            scope=f"keel-{uuid.uuid4().hex[:8]}",
        )

    def url(self, database: str) -> str:
        """``KEEL_DATABASE_URL`` naming both servers; clients find the primary."""
        hosts = f"{self.primary.address},{self.standby.address}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def _config(self, server: PgServer) -> dict[str, object]:
        """The server's Patroni configuration (JSON is YAML too)."""
        return {
            "scope": self.scope,
            "namespace": "/keel-ha/",
            "name": server.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{server.api_port}",
                "connect_address": f"127.0.0.1:{server.api_port}",
            },
            "etcd3": {"hosts": self.etcd.address},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "synchronous_mode": True,
                    "primary_start_timeout": 0,
                    "maximum_lag_on_failover": 1048576,
                    "postgresql": {"use_pg_rewind": True, "parameters": PARAMETERS},
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, "no-sync"],
                "pg_hba": HBA,
            },
            "postgresql": {
                "listen": server.address,
                "connect_address": server.address,
                "data_dir": str(server.data),
                "bin_dir": str(bindir()),
                "pgpass": str(self.root / f"{server.name}.pgpass"),
                "pg_hba": HBA,
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "basebackup": [{"checkpoint": "fast"}],
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }

    def _launch(self, server: PgServer) -> None:
        config = self.root / f"{server.name}.yml"
        config.write_text(json.dumps(self._config(server), indent=2))
        chown_to(config, self.user)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "KEEL_"))}
        server.process = self.group.start(
            server.name, [patroni_binary(), str(config)], env, cwd=self.root, user=self.user
        )

    async def _await_role(self, server: PgServer, *, primary: bool, timeout: float) -> None:
        async def arrived() -> bool:
            if not server.running:
                raise ClusterError(f"Patroni {server.name} exited:\n{server.tail()}")
            return await server.in_recovery() is (not primary)

        role = "primary" if primary else "standby"
        await wait_until(arrived, what=f"{server.name} answering as {role}", timeout=timeout)

    async def start(self) -> None:
        chown_to(self.root, self.user)
        self.etcd.data.mkdir(mode=0o700)
        await self.etcd.start(self.group)
        self._launch(self.primary)
        await self._await_role(self.primary, primary=True, timeout=START_TIMEOUT)
        self._launch(self.standby)
        await self._await_role(self.standby, primary=False, timeout=START_TIMEOUT)
        await self.await_synchronous()

    async def await_synchronous(self, timeout: float = START_TIMEOUT) -> None:
        """Until the standby streams from the primary as its synchronous standby, and
        Patroni knows it (only then may it promote the standby)."""

        async def streaming() -> bool:
            conn = await asyncpg.connect(self.primary.dsn(), timeout=5)
            try:
                state: str | None = await conn.fetchval(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                )
            finally:
                await conn.close()
            return state == "sync" and await self._patroni_role(self.standby) == "sync_standby"

        await wait_until(streaming, what="the standby streaming synchronously", timeout=timeout)

    async def _patroni_role(self, server: PgServer) -> str | None:
        """The role Patroni's cluster view gives ``server`` (``leader``, ``sync_standby``...)."""
        url = f"http://127.0.0.1:{self.primary.api_port}/cluster"
        try:
            async with httpx.AsyncClient(timeout=3) as http:
                members = (await http.get(url)).json().get("members", [])
        except (httpx.HTTPError, ValueError):
            return None
        for member in members:
            if member.get("name") == server.name:
                role: str | None = member.get("role")
                return role
        return None

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every backend of it (a crash). Its Patroni
        lives on, notices, and hands the leadership over."""
        postmaster = self.primary.postmaster_pid()
        if postmaster is None:
            raise ClusterError(f"{self.primary.name} runs no postmaster:\n{self.primary.tail()}")
        for pid in [postmaster, *_children(postmaster)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def await_failover(self, timeout: float = FAILOVER_TIMEOUT) -> float:
        """Wait, doing nothing, until Patroni promoted the standby and it takes writes;
        then it is :attr:`primary`. The seconds waited."""
        began = time.monotonic()
        await self._await_role(self.standby, primary=True, timeout=timeout)
        self.primary, self.standby = self.standby, self.primary
        return time.monotonic() - began

    async def create_database(self, name: str) -> str:
        """A new database on the primary; its ``KEEL_DATABASE_URL`` (both servers)."""
        conn = await asyncpg.connect(self.primary.dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.url(name)

    def tear_down(self) -> None:
        """SIGKILL Patroni, etcd and every server, and remove their directory; synchronous."""
        for process in self.group.processes.values():
            process.kill_group()
        remove_root(self.root)


@asynccontextmanager
async def pg_cluster() -> AsyncIterator[PgCluster]:
    """A primary streaming to a synchronous standby under Patroni, torn down afterwards."""
    cluster = PgCluster.create(make_root("postgres"))
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.tear_down()
