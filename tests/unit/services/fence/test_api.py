"""The files keel-compute and keel-fence share, and the locks that say who runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from services.fence.api import (
    FENCE_LOCK,
    STALE_AFTER,
    FenceStatus,
    FileLeaseStore,
    HeldLock,
    Lease,
)


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def status(store: FileLeaseStore, beat_at: float) -> FenceStatus:
    return FenceStatus(boot=store.boot, pid=os.getpid(), beat_at=beat_at, state="armed")


async def test_a_lease_is_read_back_as_written(tmp_path: Path) -> None:
    store = FileLeaseStore(tmp_path)
    lease = Lease(boot=store.boot, length=120.0, expires_at=1234.5, reconciled_at=1200.0)

    await store.write_lease(lease)

    assert await store.read_lease() == lease
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json"], "no scratch left"  # noqa: ASYNC240


async def test_a_missing_or_unreadable_file_reads_as_nothing(tmp_path: Path) -> None:
    store = FileLeaseStore(tmp_path)
    assert await store.read_lease() is None

    (tmp_path / "lease.json").write_text("{not json")
    (tmp_path / "fence.json").write_text('{"boot": 1}')

    assert await store.read_lease() is None
    assert await store.read_status() is None


async def test_a_fence_is_alive_while_it_holds_its_lock_and_looks(tmp_path: Path) -> None:
    clock = Clock()
    store = FileLeaseStore(tmp_path, clock=clock)
    await store.write_status(status(store, clock.now))
    assert not store.fence_alive(), "no lock held: no fence runs"

    lock = HeldLock(tmp_path / FENCE_LOCK)
    assert lock.acquire()
    assert store.fence_alive()

    clock.now += STALE_AFTER + 1
    assert not store.fence_alive(), "it holds its lock but stopped looking: hung"

    lock.release()


async def test_a_status_of_another_boot_is_no_live_fence(tmp_path: Path) -> None:
    clock = Clock()
    store = FileLeaseStore(tmp_path, clock=clock)
    old = status(store, clock.now).model_copy(update={"boot": "an-earlier-boot"})
    await store.write_status(old)
    lock = HeldLock(tmp_path / FENCE_LOCK)
    assert lock.acquire()

    assert not store.fence_alive()
    lock.release()


def test_one_agent_holds_a_host(tmp_path: Path) -> None:
    first, second = FileLeaseStore(tmp_path), FileLeaseStore(tmp_path)

    assert first.hold_agent()
    assert not second.hold_agent()
    assert second.agent_alive()
    first.drop_agent()
    assert not second.agent_alive()
    assert second.hold_agent()
    second.drop_agent()


def test_a_killed_holder_lets_go_of_its_lock(tmp_path: Path) -> None:
    """The kernel releases an flock when its holder dies, however it dies."""
    code = (
        "import sys, time; from pathlib import Path; from services.fence.api import HeldLock; "
        "assert HeldLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / FENCE_LOCK)], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        lock = HeldLock(tmp_path / FENCE_LOCK)
        assert not lock.acquire()
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 5
    while not lock.acquire():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    lock.release()
