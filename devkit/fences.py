"""The keel-fence processes a test run or a local cloud started, found again to stop them.

An agent starts its host's fence in a session of its own, so that the fence outlives the
agent — and so the test or the local cloud that started the agent. A run tags what it
starts with :data:`RUN_ID` in the environment (agents pass it on to their fences), and
:func:`stop_fences` finds the fences carrying its tag (``/proc/<pid>/environ``) and
stops them, leaving every other fence on the machine alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

#: The variable that tags a run's processes (not ``KEEL_*``: every cloud's environment
#: keeps it).
RUN_ID = "DEVKIT_RUN_ID"
_FENCE_MODULE = b"services.fence.main"


def tag_this_run() -> str:
    """This process's run id (set in its environment, so children inherit it)."""
    run_id = os.environ.get(RUN_ID)
    if not run_id:
        run_id = os.environ[RUN_ID] = secrets.token_hex(8)
    return run_id


def fences_of(run_id: str) -> list[int]:
    """The pids of the keel-fence processes tagged ``run_id``."""
    tag = f"{RUN_ID}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if _FENCE_MODULE not in (entry / "cmdline").read_bytes():
                continue
            if tag not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def stop_fences(run_id: str, *, grace: float = 3.0) -> int:
    """Stop the run's fences (SIGTERM, then SIGKILL after ``grace`` seconds); how many."""
    pids = fences_of(run_id)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and fences_of(run_id):
        time.sleep(0.05)
    for pid in fences_of(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)
