"""A one-member etcd on this machine: the store a test's Patroni cluster keeps its leader in.

Debian's ``etcd-server`` package (``/usr/bin/etcd``; ``KEEL_HA_ETCD`` names another),
started on two free ports of 127.0.0.1 with its data in the cluster's directory, in the
cluster's :class:`~devkit.processes.ProcessGroup` (torn down with it). Never the
machine's own etcd, if it runs one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx

from devkit.clusters import ClusterError, free_ports
from devkit.processes import Process, ProcessGroup
from devkit.readiness import wait_until

START_TIMEOUT = 30.0


def etcd_binary() -> str:
    configured = os.environ.get("KEEL_HA_ETCD")
    found = configured or shutil.which("etcd")
    if not found:
        raise ClusterError(
            "etcd is not installed: apt-get install etcd-server (deploy/dev-servers.sh does), "
            "or set KEEL_HA_ETCD"
        )
    return found


@dataclass
class EtcdServer:
    client_port: int
    peer_port: int
    data: Path
    process: Process | None = None

    @classmethod
    def create(cls, root: Path) -> EtcdServer:
        client, peer = free_ports(2)
        return cls(client, peer, root / "etcd")

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    async def start(self, group: ProcessGroup) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            etcd_binary(), "--name", "keel", "--data-dir", str(self.data),
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"keel={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--logger", "zap",
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.process = group.start("etcd", argv, env, cwd=self.data.parent)
        await wait_until(self._healthy, what="etcd answering", timeout=START_TIMEOUT)

    async def _healthy(self) -> bool:
        if self.process is not None and self.process.exit_code() is not None:
            raise ClusterError(f"etcd exited:\n{self.process.tail(40)}")
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                answer = await http.get(f"{self.client_url}/health")
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and answer.json().get("health") == "true"
