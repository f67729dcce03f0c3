"""A RabbitMQ cluster of three nodes on this machine, for the HA tests and benchmarks.

Each node has its own node name (``<cluster>-<n>@localhost``), AMQP and distribution
ports, data and log directories, and an empty plugins file; the nodes share an Erlang
cookie in a ``HOME`` of their own and an ``epmd`` on a port of their own, so nothing
here touches the machine's own RabbitMQ (``/var/lib/rabbitmq``, ports 5672, 15672,
25672 and 4369). The nodes start at once; the second and third then join the first
with ``rabbitmqctl join_cluster``. Partitions are handled with ``pause_minority``.

Faults a test can cause: :meth:`RabbitCluster.kill` (SIGKILL a node and everything it
started), :meth:`RabbitCluster.restart` (stop a node cleanly and start it again, as a
rolling upgrade does), :meth:`RabbitCluster.pause` (freeze a node with SIGSTOP for
longer than the distribution tick: the others count it out, and on waking it finds
itself in the minority and pauses until it sees them again). :meth:`RabbitCluster.leader`
says which node leads a quorum queue.

:func:`rabbit_cluster` starts one and always tears it down (SIGKILL, directories
removed), whatever happened meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from devkit.clusters import ClusterError, free_ports, make_root, remove_root, run
from devkit.processes import Process, ProcessGroup
from devkit.readiness import wait_until

#: Where the Debian package keeps the real scripts (its ``/usr/sbin`` wrappers switch
#: to the ``rabbitmq`` user and the machine's own node). Overridden by
#: ``KEEL_HA_RABBITMQ_SBIN``.
SBIN_GLOB = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"
#: Seconds a node may take to boot (three boot at once on a busy machine).
BOOT_TIMEOUT = 120.0
#: The distribution tick: a node silent for about this long is counted out.
NET_TICKTIME = 6
CLI_TIMEOUT = 90.0


def sbin() -> Path:
    configured = os.environ.get("KEEL_HA_RABBITMQ_SBIN")
    if configured:
        return Path(configured)
    found = sorted(glob.glob(SBIN_GLOB))
    if not found:
        raise ClusterError(
            "RabbitMQ's scripts are not installed (no "
            f"{SBIN_GLOB}): apt-get install rabbitmq-server, or set KEEL_HA_RABBITMQ_SBIN"
        )
    return Path(found[-1])


def _epmd() -> str:
    found = shutil.which("epmd")
    if found is None:
        raise ClusterError("epmd (Erlang's port mapper) is not on PATH: install erlang-base")
    return found


@dataclass
class RabbitNode:
    index: int
    name: str
    port: int
    dist_port: int
    directory: Path
    env: dict[str, str] = field(default_factory=dict)
    process: Process | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def label(self) -> str:
        """``rabbit<n>``: the node's name in logs and reports."""
        return f"rabbit{self.index}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.exit_code() is None

    def tail(self) -> str:
        return self.process.tail(40) if self.process is not None else "(never started)"


@dataclass
class RabbitCluster:
    root: Path
    group: ProcessGroup
    nodes: list[RabbitNode] = field(default_factory=list)
    epmd: Process | None = None
    epmd_port: int = 0
    cli_ports: tuple[int, int] = (0, 0)
    user: str = "guest"
    password: str = "guest"

    def url(self, vhost: str = "", query: str = "") -> str:
        """``KEEL_TRANSPORT_URL`` naming every node."""
        hosts = ",".join(node.address for node in self.nodes)
        suffix = f"?{query}" if query else ""
        return f"amqp://{self.user}:{self.password}@{hosts}/{vhost}{suffix}"

    def node_url(self, node: RabbitNode) -> str:
        return f"amqp://{self.user}:{self.password}@{node.address}/"

    def by_name(self, name: str) -> RabbitNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ClusterError(f"no node {name} in this cluster")

    def by_address(self, address: str) -> RabbitNode:
        for node in self.nodes:
            if node.address == address:
                return node
        raise ClusterError(f"no node at {address} in this cluster")

    def _env(self) -> dict[str, str]:
        """What every node and every CLI call of this cluster runs with."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.root / "home"),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_CONF_ENV_FILE=str(self.root / "rabbitmq-env.conf"),
            RABBITMQ_CTL_DIST_PORT_MIN=str(self.cli_ports[0]),
            RABBITMQ_CTL_DIST_PORT_MAX=str(self.cli_ports[1]),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.root / "enabled_plugins"),
            RABBITMQ_CTL_ERL_ARGS="-start_epmd false",
        )
        return env

    def _node_env(self, node: RabbitNode) -> dict[str, str]:
        env = self._env()
        env.update(
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(node.port),
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_CONFIG_FILE=str(node.directory / "rabbitmq"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(node.directory / "advanced.config"),
            RABBITMQ_MNESIA_BASE=str(node.directory / "mnesia"),
            RABBITMQ_LOG_BASE=str(node.directory / "log"),
            RABBITMQ_PID_FILE=str(node.directory / "pid"),
            # The cluster's own epmd runs already: a node must not start one of its own,
            # which would daemonize out of reach of the teardown.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-kernel inet_dist_use_interface {127,0,0,1} -start_epmd false"
            ),
        )
        return env

    def _prepare(self, size: int) -> None:
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        ports = free_ports(2 * size + 2 + 11)
        self.epmd_port = ports.pop()
        # The CLI's own distribution ports: eleven in a row, as rabbitmqctl wants.
        first = ports.pop()
        self.cli_ports = (first, first + 10) if first + 10 < 65536 else (first - 10, first)
        tag = self.root.name.rsplit("-", 1)[-1].lower()
        for index in range(1, size + 1):
            directory = self.root / f"node{index}"
            directory.mkdir()
            port, dist_port = ports.pop(), ports.pop()
            (directory / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{port}\n"
                "cluster_partition_handling = pause_minority\n"
                "loopback_users = none\n"
                "log.console = false\n"
                "log.file.level = info\n"
            )
            (directory / "advanced.config").write_text(
                f"[{{kernel, [{{net_ticktime, {NET_TICKTIME}}}]}}].\n"
            )
            node = RabbitNode(
                index=index,
                name=f"keelha{tag}-{index}@localhost",
                port=port,
                dist_port=dist_port,
                directory=directory,
            )
            node.env = self._node_env(node)
            self.nodes.append(node)

    async def ctl(self, node: RabbitNode, *args: str, tool: str = "rabbitmqctl") -> str:
        """Run a RabbitMQ CLI tool against ``node``; its output."""
        return await run(
            [str(sbin() / tool), "-n", node.name, "-q", *args],
            env=self._env(),
            timeout=CLI_TIMEOUT,
        )

    async def _await_boot(self, node: RabbitNode) -> None:
        """Until the node has booted; it may not have registered with epmd yet, when
        ``await_startup`` fails at once."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            left = int(deadline - time.monotonic())
            try:
                await self.ctl(node, "await_startup", "-t", str(max(left, 1)))
                return
            except ClusterError as exc:
                if not node.running or left <= 0:
                    raise ClusterError(f"{node.name} did not start: {exc}\n{node.tail()}") from None
            await asyncio.sleep(0.5)

    async def start(self, size: int = 3) -> None:
        self._prepare(size)
        epmd = [_epmd(), "-port", str(self.epmd_port), "-address", "127.0.0.1"]
        self.epmd = self.group.start("epmd", epmd, self._env(), cwd=self.root)
        await self._await_epmd()
        for node in self.nodes:
            self._launch(node)
        await asyncio.gather(*(self._await_boot(node) for node in self.nodes))
        first, others = self.nodes[0], self.nodes[1:]
        await asyncio.gather(*(self.ctl(node, "stop_app") for node in others))
        for node in others:
            await self.ctl(node, "join_cluster", first.name)
        await asyncio.gather(*(self.ctl(node, "start_app") for node in others))
        running = await self.running_nodes(first)
        if len(running) != size:
            raise ClusterError(f"only {running} of the {size} nodes are clustered")

    async def _await_epmd(self) -> None:
        async def listening() -> bool:
            if self.epmd is not None and self.epmd.exit_code() is not None:
                raise ClusterError(f"epmd exited:\n{self.epmd.tail()}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.epmd_port)
            except OSError:
                return False
            writer.close()
            return True

        await wait_until(listening, what="epmd listening", timeout=30, interval=0.05)

    def _launch(self, node: RabbitNode) -> None:
        argv = [str(sbin() / "rabbitmq-server")]
        node.process = self.group.start(node.label, argv, node.env, cwd=node.directory)

    async def running_nodes(self, via: RabbitNode) -> list[str]:
        """The nodes ``via`` sees running in the cluster."""
        status = json.loads(await self.ctl(via, "cluster_status", "--formatter", "json"))
        return sorted(status["running_nodes"])

    async def kill(self, node: RabbitNode) -> None:
        """SIGKILL the node and everything it started (a crash, a power cut)."""
        if node.process is not None:
            node.process.kill_group()

    async def stop_node(self, node: RabbitNode) -> None:
        """Stop the node cleanly, as an operator stops it for an upgrade."""
        with contextlib.suppress(ClusterError):
            await self.ctl(node, "stop")
        if node.process is not None:
            node.process.stop(30)
            node.process.kill_group()

    async def start_node(self, node: RabbitNode) -> None:
        """Start a node that was stopped or killed; it rejoins the cluster by itself."""
        self._launch(node)
        await self._await_boot(node)

    async def restart(self, node: RabbitNode) -> None:
        await self.stop_node(node)
        await self.start_node(node)

    async def await_quorum_plus_one(self, node: RabbitNode, timeout: float = 120) -> None:
        """Until stopping ``node`` leaves every quorum queue with a majority online."""
        await self.ctl(
            node, "await_online_quorum_plus_one", "-t", str(int(timeout)), tool="rabbitmq-upgrade"
        )

    async def pause(self, node: RabbitNode, seconds: float) -> None:
        """Freeze the node (SIGSTOP) for ``seconds``, then let it run again."""
        assert node.process is not None
        node.process.signal_group(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            node.process.signal_group(signal.SIGCONT)

    async def leader(self, queue: str, vhost: str = "/", *, timeout: float = 30.0) -> RabbitNode:
        """The node leading quorum queue ``queue``, asked of any node that runs.

        Right after its leader died a queue is left out of ``list_queues`` (or shows no
        leader) until its members have elected another: asked again until ``timeout``.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            answered = False
            for node in self.nodes:
                if not node.running:
                    continue
                try:
                    output = await self.ctl(
                        node, "list_queues", "-p", vhost, "--no-table-headers", "name", "leader"
                    )
                except ClusterError:
                    continue
                answered = True
                for line in output.splitlines():
                    name, _, leader = line.partition("\t")
                    if name == queue and leader.strip():
                        try:
                            return self.by_name(leader.strip())
                        except ClusterError:
                            break
                break
            if asyncio.get_running_loop().time() > deadline:
                if not answered:
                    raise ClusterError("no node of the cluster answers")
                raise ClusterError(f"queue {queue} not found on the cluster")
            await asyncio.sleep(0.5)

    async def members(self, queue: str, vhost: str = "/") -> list[str]:
        """The nodes holding a replica of quorum queue ``queue``."""
        node = next(node for node in self.nodes if node.running)
        output = await self.ctl(
            node, "list_queues", "-p", vhost, "--no-table-headers", "name", "members"
        )
        for line in output.splitlines():
            name, _, members = line.partition("\t")
            if name == queue:
                return sorted(m.strip(" []") for m in members.split(",") if "@" in m)
        raise ClusterError(f"queue {queue} not found on the cluster")

    async def all_running(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Start any node that is down, and wait until every node runs the broker."""
        for node in self.nodes:
            if not node.running:
                await self.start_node(node)

        async def accepting() -> bool:
            for node in self.nodes:
                try:
                    connection = await aio_pika.connect(self.node_url(node), timeout=5)
                except (OSError, TimeoutError, aio_pika.exceptions.AMQPError):
                    return False
                await connection.close()
            return True

        await wait_until(accepting, what="every node accepting connections", timeout=timeout)

    def tear_down(self) -> None:
        """SIGKILL every node and epmd; remove the directories. Synchronous, so it runs
        even while an event loop is being cancelled."""
        for process in self.group.processes.values():
            process.kill_group()
        remove_root(self.root)


@asynccontextmanager
async def rabbit_cluster(size: int = 3) -> AsyncIterator[RabbitCluster]:
    """A running cluster of ``size`` nodes, torn down on the way out whatever happens."""
    root = make_root("rabbitmq")
    cluster = RabbitCluster(root, ProcessGroup(root / "logs"))
    try:
        await cluster.start(size)
        yield cluster
    finally:
        cluster.tear_down()
