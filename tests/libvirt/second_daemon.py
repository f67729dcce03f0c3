"""A second libvirtd on this machine, for live migration tests.

libvirt refuses to migrate a domain to the daemon it runs under (the same host UUID), so
the tier starts a daemon of its own: ``libvirtd --listen`` in a private mount namespace
(``unshare --mount --propagation private``) whose ``/etc/libvirt``, ``/run/libvirt``,
``/var/lib/libvirt``, ``/var/cache/libvirt`` and ``/var/log/libvirt`` are bind mounts of
directories under the test's own directory. The system daemon's files are never read or
written: the second daemon has its own configuration (its own ``host_uuid``, TCP port,
migration and display port ranges), its own sockets, domain definitions and logs.
Everything else — ``/tmp`` with the tests' guest directories, ``/dev/kvm``, the network
— is the machine's, so both daemons see a guest's files at the same paths.

The daemon answers only on 127.0.0.1 (``qemu+tcp://127.0.0.1:PORT/system``, no
authentication: a test daemon on loopback), and QEMU writes guests' logs itself
(``stdio_handler = "file"``): the system's ``virtlogd`` socket is under the hidden
``/run/libvirt``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.libvirt.guests import free_port

#: The system directories the daemon gets its own copies of.
PRIVATE_DIRS = {
    "etc": "/etc/libvirt",
    "run": "/run/libvirt",
    "lib": "/var/lib/libvirt",
    "cache": "/var/cache/libvirt",
    "log": "/var/log/libvirt",
}
#: Seconds the daemon may take to answer, and to stop.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


@dataclass(frozen=True)
class SecondDaemon:
    root: Path
    port: int
    host_uuid: uuid.UUID
    pid: int
    #: The first of the daemon's migration ports (it has :data:`PORT_SPAN` of them).
    migration_ports: tuple[int, int]

    @property
    def uri(self) -> str:
        return f"qemu+tcp://127.0.0.1:{self.port}/system"

    @property
    def log(self) -> Path:
        return self.root / "log" / "libvirtd.log"


#: How many ports each of the daemon's ranges (migration, display) spans.
PORT_SPAN = 16


def _port_ranges() -> tuple[tuple[int, int], tuple[int, int]]:
    """Migration and display ranges, away from the system daemon's defaults (49152-49215
    and 5900-65535 for displays is its whole range; guests here have no display)."""
    base = random.randrange(50000, 59000, PORT_SPAN * 2)
    return (base, base + PORT_SPAN - 1), (base + PORT_SPAN, base + 2 * PORT_SPAN - 1)


def write_config(root: Path, port: int, host_uuid: uuid.UUID) -> tuple[int, int]:
    """The daemon's directories and configuration under ``root``; its migration ports."""
    for name in PRIVATE_DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
    migration, display = _port_ranges()
    (root / "etc" / "libvirtd.conf").write_text(
        "\n".join(
            [
                f'host_uuid = "{host_uuid}"',
                "listen_tls = 0",
                "listen_tcp = 1",
                'listen_addr = "127.0.0.1"',
                f'tcp_port = "{port}"',
                'auth_tcp = "none"',
                'auth_unix_rw = "none"',
                # The daemon's own log, visible outside the namespace.
                'log_outputs = "3:file:/var/log/libvirt/libvirtd.log"',
                "",
            ]
        )
    )
    (root / "etc" / "qemu.conf").write_text(
        "\n".join(
            [
                'user = "root"',
                'group = "root"',
                'stdio_handler = "file"',
                'security_driver = "none"',
                f"migration_port_min = {migration[0]}",
                f"migration_port_max = {migration[1]}",
                f"remote_display_port_min = {display[0]}",
                f"remote_display_port_max = {display[1]}",
                f"websocket_port_min = {display[0]}",
                f"websocket_port_max = {display[1]}",
                "",
            ]
        )
    )
    return migration


def _script(root: Path, pid_file: Path) -> str:
    mounts = "\n".join(
        f"mount --bind {root / name} {target}" for name, target in PRIVATE_DIRS.items()
    )
    return (
        "set -e\n"
        f"{mounts}\n"
        f"exec libvirtd --listen --config /etc/libvirt/libvirtd.conf --pid-file {pid_file}\n"
    )


def _answers(uri: str) -> bool:
    import libvirt  # noqa: PLC0415 - the tier's optional binding

    try:
        libvirt.open(uri).close()
    except libvirt.libvirtError:
        return False
    return True


def start(root: Path) -> SecondDaemon:
    """Start the daemon with its files under ``root``; return once it answers."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    host_uuid = uuid.uuid4()
    migration = write_config(root, port, host_uuid)
    pid_file = root / "libvirtd.pid"
    out = (root / "daemon.out").open("ab")
    # unshare execs the shell in the new namespace (no --fork), and the shell execs
    # libvirtd: the process started here *is* the daemon.
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _script(root, pid_file)],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    daemon = SecondDaemon(
        root=root, port=port, host_uuid=host_uuid, pid=process.pid, migration_ports=migration
    )
    deadline = time.monotonic() + START_TIMEOUT
    while not _answers(daemon.uri):
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            output = (root / "daemon.out").read_text(errors="replace")
            raise RuntimeError(
                f"the second libvirtd did not answer at {daemon.uri}: {output[-2000:]}"
            )
        time.sleep(0.2)
    return daemon


def kill(daemon: SecondDaemon) -> None:
    """The daemon dies at once (SIGKILL), as in a crash; its QEMU processes live on."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(daemon.pid, 0)


def _kill_leftover_guests(daemon: SecondDaemon) -> None:
    """QEMU processes the daemon started and could not destroy (it was killed): their pid
    files are in its private ``/run/libvirt/qemu``."""
    for pid_file in (daemon.root / "run" / "qemu").glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop(daemon: SecondDaemon) -> None:
    """Destroy the daemon's domains (their QEMU processes outlive it), then stop it."""
    import libvirt  # noqa: PLC0415

    with contextlib.suppress(libvirt.libvirtError):
        conn = libvirt.open(daemon.uri)
        try:
            for dom in conn.listAllDomains(0):
                with contextlib.suppress(libvirt.libvirtError):
                    if dom.isActive():
                        dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefine()
        finally:
            conn.close()
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            done, _status = os.waitpid(daemon.pid, os.WNOHANG)
        except ChildProcessError:
            done = daemon.pid
        if done:
            _kill_leftover_guests(daemon)
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(daemon.pid, 0)
    _kill_leftover_guests(daemon)


@contextlib.contextmanager
def running(root: Path) -> Iterator[SecondDaemon]:
    daemon = start(root)
    try:
        yield daemon
    finally:
        stop(daemon)
