"""What the cluster harnesses share (:mod:`devkit.rabbit_cluster`,
:mod:`devkit.pg_cluster`): a directory per cluster, servers that are always torn down,
and running the servers' command-line tools.

A cluster's servers (RabbitMQ nodes and their ``epmd``, PostgreSQL postmasters) are
started through a :class:`~devkit.processes.ProcessGroup`, each in a session of its own
and with its working directory in the cluster's directory under the system temporary
directory; :meth:`~devkit.processes.Process.signal_group` reaches a server with every
process it started (``beam.smp``'s helpers, PostgreSQL's backends). The directory holds
``owner.pid``, the pid of the process that made it: a run that died without tearing
down is found by :func:`reap_orphans` at the next start, and the processes working in
its directory are killed — nobody else's. The machine's own servers never are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Directories of clusters are named ``<PREFIX><kind>-<random>`` under the temporary
#: directory.
PREFIX = "keel-ha-"
OWNER_FILE = "owner.pid"


class ClusterError(Exception):
    """A cluster could not be started or did not do what was asked; says why."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_root(kind: str) -> Path:
    """A new cluster directory, readable by the servers' users, with its owner noted."""
    reap_orphans()
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-"))
    root.chmod(0o755)
    (root / OWNER_FILE).write_text(str(os.getpid()))
    return root


def working_in(root: Path) -> list[int]:
    """Pids of the processes working in ``root``: their working directory is ``root`` or
    below it, or their environment names it (a daemon that left for ``/``, such as an
    ``epmd -daemon`` a node started, still carries the cluster's ``HOME``)."""
    found: list[int] = []
    marker = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if cwd == root or root in cwd.parents or marker + b"/" in environ:
            found.append(int(entry.name))
    return found


def remove_root(root: Path) -> None:
    """SIGKILL every process still working in ``root``, then remove it."""
    for pid in working_in(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def reap_orphans() -> None:
    """Tear down the clusters of runs that died without doing it (owner pid gone)."""
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            remove_root(root)


def run_as() -> str | None:
    """The user PostgreSQL must run as: ``postgres`` when we are root, else ourselves."""
    return "postgres" if os.geteuid() == 0 else None


def chown_to(path: Path, user: str | None) -> None:
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


async def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    user: str | None = None,
) -> str:
    """Run a command-line tool to completion; its output. ClusterError if it fails or
    hangs."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env) if env is not None else None,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        user=user,
    )
    try:
        async with asyncio.timeout(timeout):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ClusterError(f"{' '.join(argv)} did not finish within {timeout:g}s") from None
    text = output.decode("utf-8", errors="replace")
    if process.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({process.returncode}):\n{text[-2000:]}")
    return text
