"""A group of keel processes started from the virtualenv's console scripts.

Each process logs (stdout and stderr) to ``<logs>/<name>.log``, appended to when a
process is started again under the same name, and runs in its own session so a
terminal's Ctrl-C reaches only the harness. Stopping is SIGTERM, a bounded wait, then
SIGKILL; :meth:`ProcessGroup.stop_all` signals every process first so they drain at
the same time, and stops them in reverse start order. A server that starts helpers of
its own (a RabbitMQ node, a PostgreSQL postmaster) is signalled with everything it
started through :meth:`Process.signal_group`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Where the console scripts (keel-api, keel-manage, openstack, ...) are.
BIN = Path(sys.executable).parent
STOP_TIMEOUT = 15.0
TAIL_LINES = 80


@dataclass
class Process:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes]
    #: Whether :meth:`stop` had to SIGKILL it.
    killed: bool = False

    @property
    def binary(self) -> str:
        """The console script's name, e.g. ``keel-compute``."""
        return Path(self.argv[0]).name

    @property
    def host(self) -> str:
        """The ``KEEL_HOST`` the process runs as."""
        return self.env.get("KEEL_HOST", "")

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.popen.poll()

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines of its log."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def read_log(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process and every process it started (its session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL the process and everything it started, and reap it."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(STOP_TIMEOUT)

    def terminate(self) -> None:
        """SIGTERM if it still runs; do not wait."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.killed = True
                self.popen.wait()
        return self.popen.returncode

    def rss_mb(self) -> float:
        """Resident memory now, from ``/proc`` (MiB); NaN once it has exited."""
        try:
            status = Path(f"/proc/{self.popen.pid}/status").read_text()
        except OSError:
            return float("nan")
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        """CPU time used so far (user + system), from ``/proc``; NaN once it has exited."""
        try:
            fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return float("nan")
        # utime and stime are fields 14 and 15 of stat(5); after the ")" they are 12, 13.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessGroup:
    """Processes by name, logging under ``logs``."""

    logs: Path
    stop_timeout: float = STOP_TIMEOUT
    processes: dict[str, Process] = field(default_factory=dict)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        cwd: Path | None = None,
        user: str | None = None,
    ) -> Process:
        """Start ``argv`` (its first word a console script, or a path) as ``name``.

        A name may be used again once its process has exited: the log is appended to.
        ``user``: run as that user (PostgreSQL refuses to run as root).
        """
        old = self.processes.get(name)
        if old is not None and old.exit_code() is None:
            raise RuntimeError(f"{name} is still running")
        program = argv[0] if "/" in argv[0] else str(BIN / argv[0])
        command = [program, *argv[1:]]
        log = self.logs / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            popen = subprocess.Popen(
                command,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
            )
        process = Process(name, command, dict(env), log, popen)
        self.processes[name] = process
        return process

    def __getitem__(self, name: str) -> Process:
        return self.processes[name]

    def dead(self) -> list[Process]:
        """The processes that have exited, in start order."""
        return [p for p in self.processes.values() if p.exit_code() is not None]

    def describe(self, lines: int = TAIL_LINES) -> str:
        """Every process's exit code (None while running) and log tail."""
        return "\n".join(
            f"----- {p.name} (exit code {p.exit_code()}) -----\n{p.tail(lines)}"
            for p in self.processes.values()
        )

    def stop_all(self, on_kill: Callable[[Process], None] | None = None) -> None:
        """SIGTERM to all, then each in reverse start order: a bounded wait, SIGKILL.

        ``on_kill`` hears of every process that had to be killed.
        """
        for process in reversed(self.processes.values()):
            process.terminate()
        for process in reversed(self.processes.values()):
            if process.exit_code() is None:
                process.stop(self.stop_timeout)
                if on_kill is not None and process.killed:
                    on_kill(process)
