"""What keel-compute and its host's keel-fence tell each other: the only way in.

The agent and the fence share nothing but the agent's state directory: no socket, no
broker, no database. Two small JSON files carry everything, each written by one side
only and replaced whole (a reader sees the old file or the new one, never a mix):

* ``lease.json`` (the agent writes it) — the **lease**: until when the fence may let
  the host's guests run (``expires_at``), renewed only after a heartbeat the control
  plane answered, by the lease's ``length`` counted from when that heartbeat was sent;
  when the agent last finished reconciling its guests with the control plane
  (``reconciled_at``: what lifts a fencing); and ``released``, set by an agent that
  stopped cleanly with no guest running (the fence may exit).
* ``fence.json`` (the fence writes it, every tick) — the fence's **status**: its pid,
  when it last looked (``beat_at``), whether it is ``armed`` (a lease runs), ``fired``
  (a lease ran out: it powered the guests off and keeps them off until the agent has
  reconciled) or ``unarmed`` (no lease yet), how many times it fired.

Times are seconds of the host's monotonic clock (``CLOCK_MONOTONIC``, shared by every
process of one boot and never set back), tagged with the boot they belong to
(``/proc/sys/kernel/random/boot_id``): a lease from an earlier boot guards nothing (its
guests did not survive the reboot). Locks tell who runs: the fence holds ``fence.lock``
and the agent ``agent.lock`` (``flock``; the kernel releases them when the process
dies, however it dies).

:class:`FileLeaseStore` is that, on a host. :class:`MemoryLeaseStore` keeps the same in
memory, for guests that live in memory too (the fake driver's) and for the model-based
test, whose clock is its own.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

LOG = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
STATUS_FILE = "fence.json"
FENCE_LOCK = "fence.lock"
AGENT_LOCK = "agent.lock"
#: The durable record of a fencing (written before the first guest is powered off).
FENCED_FILE = "fenced.json"
#: Seconds between two looks of a fence at its lease.
TICK = 0.5
#: A fence whose status is older than this many seconds is taken to be hung.
STALE_AFTER = 10 * TICK

Clock = Callable[[], float]
M = TypeVar("M", bound=BaseModel)
FenceState = Literal["unarmed", "armed", "fired", "released"]


class Lease(BaseModel):
    """The agent's side (``lease.json``)."""

    model_config = ConfigDict(frozen=True)

    boot: str
    #: Seconds a renewal lets the guests run.
    length: float
    #: When the lease runs out (monotonic clock).
    expires_at: float
    #: When the agent last began a guest report that the control plane answered and the
    #: agent acted on (monotonic clock); ``None`` before the first.
    reconciled_at: float | None = None
    #: The agent stopped cleanly with no guest running: nothing is left to guard.
    released: bool = False


class FenceStatus(BaseModel):
    """The fence's side (``fence.json``)."""

    model_config = ConfigDict(frozen=True)

    boot: str
    pid: int
    beat_at: float
    state: FenceState
    #: The lease it enforces (``None``: none yet).
    length: float | None = None
    expires_at: float | None = None
    fired_at: float | None = None
    #: Times this fence fired since it started (what the agent counts in its metrics).
    fires: int = 0
    #: Whether it keeps the host's watchdog device open (a hung fence resets the host).
    watchdog: bool = False


class LeaseStore(Protocol):
    """Where the lease and the status live (files on a host; memory in tests)."""

    boot: str

    def now(self) -> float: ...

    async def read_lease(self) -> Lease | None: ...

    async def write_lease(self, lease: Lease) -> None: ...

    async def read_status(self) -> FenceStatus | None: ...

    async def write_status(self, status: FenceStatus) -> None: ...

    def peek_status(self) -> FenceStatus | None:
        """The status as last written, read at once (a small file, or memory)."""
        ...

    def fence_alive(self) -> bool:
        """Whether a fence runs and looked at its lease lately (not dead, not hung)."""
        ...

    def agent_alive(self) -> bool:
        """Whether an agent holds this host (its lock)."""
        ...

    def hold_agent(self) -> bool:
        """Hold the host for this agent; False if another agent holds it."""
        ...

    def drop_agent(self) -> None:
        """This agent lets go of the host (it stops)."""
        ...

    def changed(self) -> asyncio.Event:
        """Set when the lease is written (a fence wakes at once instead of at its tick)."""
        ...

    def gone(self) -> bool:
        """Whether the host's state is gone (its directory removed): nothing to guard."""
        ...


def boot_id() -> str:
    """This boot of the host (a new value after every reboot)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return "unknown-boot"


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` whole under a scratch name, then rename it into place (no fsync:
    a lease is worth nothing after a crash of the host, whose next boot ignores it)."""
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    with scratch.open("wb") as stream:
        stream.write(data)
    os.replace(scratch, path)


def _read(path: Path, model: type[M]) -> M | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return model.model_validate_json(data)
    except (ValidationError, json.JSONDecodeError, ValueError) as exc:
        LOG.warning("ignoring %s: it cannot be read (%s)", path, exc)
        return None


def _held(path: Path) -> bool:
    """Whether some process holds ``path``'s lock (it exists and cannot be taken)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class HeldLock:
    """An ``flock`` held until :meth:`release` (or the process's death)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take it; False if another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FileLeaseStore:
    """The lease and the status as files in ``state_dir`` (see the module's text)."""

    def __init__(self, state_dir: Path, *, clock: Clock = time.monotonic) -> None:
        self.state_dir = state_dir
        self.boot = boot_id()
        self._clock = clock
        self._changed = asyncio.Event()
        self._agent_lock = HeldLock(state_dir / AGENT_LOCK)

    def now(self) -> float:
        return self._clock()

    @property
    def lease_path(self) -> Path:
        return self.state_dir / LEASE_FILE

    @property
    def status_path(self) -> Path:
        return self.state_dir / STATUS_FILE

    async def read_lease(self) -> Lease | None:
        return await asyncio.to_thread(_read, self.lease_path, Lease)

    async def write_lease(self, lease: Lease) -> None:
        await asyncio.to_thread(_replace, self.lease_path, lease.model_dump_json().encode())

    async def read_status(self) -> FenceStatus | None:
        return await asyncio.to_thread(_read, self.status_path, FenceStatus)

    async def write_status(self, status: FenceStatus) -> None:
        await asyncio.to_thread(_replace, self.status_path, status.model_dump_json().encode())

    def peek_status(self) -> FenceStatus | None:
        return _read(self.status_path, FenceStatus)

    def fence_alive(self) -> bool:
        if not _held(self.state_dir / FENCE_LOCK):
            return False
        status = _read(self.status_path, FenceStatus)
        return (
            status is not None
            and status.boot == self.boot
            and self._clock() - status.beat_at <= STALE_AFTER
        )

    def agent_alive(self) -> bool:
        return _held(self.state_dir / AGENT_LOCK)

    def hold_agent(self) -> bool:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return self._agent_lock.acquire()

    def drop_agent(self) -> None:
        self._agent_lock.release()

    def changed(self) -> asyncio.Event:
        return self._changed

    def gone(self) -> bool:
        return not self.state_dir.is_dir()


class MemoryLeaseStore:
    """The same, in memory: for guests in memory, and for the model's own clock.

    Whoever runs the agent and the fence says whether each lives (:attr:`agent_running`,
    :attr:`fence_running`); a fence that runs is taken to be looking.
    """

    def __init__(self, *, clock: Clock = time.monotonic, boot: str = "memory") -> None:
        self.boot = boot
        self._clock = clock
        self.lease: Lease | None = None
        self.status: FenceStatus | None = None
        self.agent_running = False
        self.fence_running = False
        self._changed = asyncio.Event()
        self._status_changed = asyncio.Event()

    def now(self) -> float:
        return self._clock()

    async def read_lease(self) -> Lease | None:
        return self.lease

    async def write_lease(self, lease: Lease) -> None:
        self.lease = lease
        self._changed.set()

    async def read_status(self) -> FenceStatus | None:
        return self.status

    async def write_status(self, status: FenceStatus) -> None:
        self.status = status
        self._status_changed.set()

    def peek_status(self) -> FenceStatus | None:
        return self.status

    def status_changed(self) -> asyncio.Event:
        """Set when the fence writes its status (an agent waiting for it wakes)."""
        return self._status_changed

    def fence_alive(self) -> bool:
        return self.fence_running

    def agent_alive(self) -> bool:
        return self.agent_running

    def hold_agent(self) -> bool:
        if self.agent_running:
            return False
        self.agent_running = True
        return True

    def drop_agent(self) -> None:
        self.agent_running = False

    def changed(self) -> asyncio.Event:
        return self._changed

    def gone(self) -> bool:
        return False
