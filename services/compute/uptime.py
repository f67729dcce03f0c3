"""The host's uptime as the ``uptime`` command prints it, for ``os-hypervisors/{id}/uptime``.

`` 08:32:11 up 93 days, 18:25,  load average: 0.20, 0.12, 0.14``: the time of day,
how long the host has been up (from ``/proc/uptime``) and its load averages. Nova shows
the compute host's line as it is; keel builds the same line without running a command.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_UPTIME = Path("/proc/uptime")


def format_uptime(now: time.struct_time, seconds: float, load: tuple[float, float, float]) -> str:
    minutes = int(seconds // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    span = f"{hours}:{minutes:02d}" if hours else f"{minutes} min"
    if days:
        span = f"{days} day{'s' if days != 1 else ''}, {span}"
    averages = ", ".join(f"{value:.2f}" for value in load)
    return f" {time.strftime('%H:%M:%S', now)} up {span},  load average: {averages}"


def host_uptime(proc_uptime: Path = PROC_UPTIME) -> str:
    """This host's uptime line; OSError if the kernel does not tell."""
    seconds = float(proc_uptime.read_text(encoding="ascii").split()[0])
    return format_uptime(time.localtime(), seconds, os.getloadavg())
