"""The cluster harness leaves nothing behind: not when a test fails, not when the process
that started the servers is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.clusters import reap_orphans, working_in
from devkit.environment import with_devkit
from devkit.pg_cluster import pg_cluster

pytestmark = [pytest.mark.ha, pytest.mark.timeout(180)]

STARTS_AND_HANGS = """
import asyncio
from devkit.pg_cluster import pg_cluster

async def main():
    async with pg_cluster() as cluster:
        print(cluster.root, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def fail_inside_a_cluster(seen: list[Path]) -> None:
    async with pg_cluster() as cluster:
        seen.append(cluster.root)
        assert cluster.primary.running
        assert working_in(cluster.root)
        raise RuntimeError("a test failed")


async def test_servers_are_gone_when_the_block_fails() -> None:
    seen: list[Path] = []
    with pytest.raises(RuntimeError, match="a test failed"):
        await fail_inside_a_cluster(seen)
    [root] = seen
    assert working_in(root) == []
    assert not root.exists()


def test_servers_of_a_killed_run_are_reaped_by_the_next_one() -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", STARTS_AND_HANGS],
        env=with_devkit(os.environ),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    root = Path(run.stdout.readline().strip())
    try:
        assert working_in(root), "the cluster's servers run"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    assert working_in(root), "SIGKILL left them running"

    reap_orphans()

    assert working_in(root) == []
    assert not root.exists()
