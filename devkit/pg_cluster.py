"""A PostgreSQL primary with a streaming standby on this machine, for the HA tests and
benchmarks.

``initdb`` makes the primary's data directory and ``pg_basebackup`` the standby's, both
under a directory of their own, each server on a free port of its own, listening on
127.0.0.1 with its socket in that directory (never the machine's server on 5432 or its
``/var/run/postgresql``). Run as the ``postgres`` user when the tests run as root.
Replication is synchronous (``synchronous_standby_names = '*'``): a commit the primary
acknowledged is on the standby too, so a failover loses nothing keel was told was done.
The standby runs without a synchronous standby of its own, so that once promoted it
commits without waiting for one.

:meth:`PgCluster.kill_primary` SIGKILLs the primary with all its backends (a crash);
:meth:`PgCluster.promote` promotes the standby (``pg_ctl promote``).
:meth:`PgCluster.url` is a ``KEEL_DATABASE_URL`` naming both servers with
``target_session_attrs=read-write``, so clients find whichever is the primary.
:func:`pg_cluster` starts one and always tears it down.
"""

from __future__ import annotations

import glob
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from devkit.clusters import (
    ClusterError,
    chown_to,
    free_ports,
    make_root,
    remove_root,
    run,
    run_as,
)
from devkit.processes import Process, ProcessGroup
from devkit.readiness import wait_until

BIN_GLOB = "/usr/lib/postgresql/*/bin"
START_TIMEOUT = 60.0
#: Settings of both servers: small, quick, and replicating.
CONFIG = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
max_connections = 300
shared_buffers = 32MB
wal_level = replica
max_wal_senders = 5
max_replication_slots = 5
hot_standby = on
synchronous_commit = on
synchronous_standby_names = '*'
wal_keep_size = 128MB
fsync = off
full_page_writes = off
logging_collector = off
log_min_messages = warning
"""
HBA = """
local all all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
local replication all trust
"""


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


@dataclass
class PgServer:
    #: ``primary`` or ``standby``: what it was when the cluster started.
    name: str
    port: int
    data: Path
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


@dataclass
class PgCluster:
    root: Path
    group: ProcessGroup
    primary: PgServer
    standby: PgServer
    user: str | None

    @classmethod
    def create(cls, root: Path) -> PgCluster:
        first, second = free_ports(2)
        return cls(
            root=root,
            group=ProcessGroup(root / "logs"),
            primary=PgServer("primary", first, root / "primary"),
            standby=PgServer("standby", second, root / "standby"),
            user=run_as(),
        )

    def _launch(self, server: PgServer) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        argv = [str(bindir() / "postgres"), "-D", str(server.data)]
        server.process = self.group.start(server.name, argv, env, cwd=self.root, user=self.user)

    def url(self, database: str) -> str:
        """``KEEL_DATABASE_URL`` naming both servers; clients find the primary."""
        hosts = f"{self.primary.address},{self.standby.address}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    async def _tool(self, name: str, *args: str) -> str:
        return await run([str(bindir() / name), *args], user=self.user, timeout=START_TIMEOUT)

    def _configure(self, server: PgServer, *, synchronous: bool) -> None:
        config = CONFIG.format(port=server.port, sockets=self.root)
        if not synchronous:
            config += "synchronous_standby_names = ''\n"
        (server.data / "postgresql.conf").write_text(config)
        (server.data / "pg_hba.conf").write_text(HBA)

    async def _await_accepting(self, server: PgServer) -> None:
        async def accepting() -> bool:
            if not server.running:
                raise ClusterError(f"{server.name} exited:\n{server.tail()}")
            try:
                conn = await asyncpg.connect(server.dsn(), timeout=5)
            except (OSError, asyncpg.PostgresError, TimeoutError):
                return False
            await conn.close()
            return True

        await wait_until(
            accepting, what=f"PostgreSQL {server.name} accepting connections", timeout=START_TIMEOUT
        )

    async def start(self) -> None:
        chown_to(self.root, self.user)
        await self._tool(
            "initdb", "-D", str(self.primary.data), "-U", "postgres", "--auth=trust", "--no-sync"
        )
        self._configure(self.primary, synchronous=True)
        self._launch(self.primary)
        await self._await_accepting(self.primary)
        await self._tool(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
            "-D", str(self.standby.data), "-X", "stream", "-R", "--no-sync",
        )  # fmt: skip
        self._configure(self.standby, synchronous=False)
        self._launch(self.standby)
        await self._await_accepting(self.standby)
        await self.await_synchronous()

    async def await_synchronous(self, timeout: float = START_TIMEOUT) -> None:
        """Until the standby streams from the primary as its synchronous standby."""

        async def streaming() -> bool:
            conn = await asyncpg.connect(self.primary.dsn(), timeout=5)
            try:
                state: str | None = await conn.fetchval(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                )
            finally:
                await conn.close()
            return state == "sync"

        await wait_until(streaming, what="the standby streaming synchronously", timeout=timeout)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every backend of it (a crash)."""
        if self.primary.process is not None:
            self.primary.process.kill_group()

    async def promote(self) -> None:
        """Promote the standby to primary and wait until it accepts writes."""
        await self._tool("pg_ctl", "promote", "-w", "-t", "60", "-D", str(self.standby.data))

        async def writable() -> bool:
            conn = await asyncpg.connect(self.standby.dsn(), timeout=5)
            try:
                in_recovery: bool = await conn.fetchval("SELECT pg_is_in_recovery()")
            finally:
                await conn.close()
            return not in_recovery

        await wait_until(writable, what="the standby accepting writes", timeout=START_TIMEOUT)

    async def create_database(self, name: str) -> str:
        """A new database on the primary; its ``KEEL_DATABASE_URL`` (both servers)."""
        conn = await asyncpg.connect(self.primary.dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.url(name)

    def tear_down(self) -> None:
        """SIGKILL both servers and remove their directories; synchronous."""
        for process in self.group.processes.values():
            process.kill_group()
        remove_root(self.root)


@asynccontextmanager
async def pg_cluster() -> AsyncIterator[PgCluster]:
    """A primary streaming to a synchronous standby, torn down on the way out."""
    cluster = PgCluster.create(make_root("postgres"))
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.tear_down()
