"""``keel-manage host drain`` of a host with 20 servers, with real processes and agents.

The local driver, three hosts, two conductors. Sixteen servers run and move live; four
are stopped and move cold (``--cold-fallback``), staying stopped. The drain runs with
``--parallel 4``:
while it runs, the number of the host's servers with a move under way is sampled and
never exceeds 4. The command is stopped with Ctrl-C, then SIGKILLed halfway, and started
again: the task goes on and each start resumes it. A conductor is SIGKILLed mid-drain:
the other goes on. In the end every server is on another host as it was (ACTIVE, or
SHUTOFF), and the drained host stays disabled, its reason naming the task.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from uuid import UUID

import pytest

from tests.e2e.cloud import Cloud, CloudConfig, Process
from tests.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

HOSTS = ("dr-a", "dr-b", "dr-c")
SERVERS = 20
#: Of them, stopped before the drain (moved cold).
STOPPED = 4
PARALLEL = 4
#: Seconds the drain may take (about a minute on a quiet machine).
DRAIN_TIME = 240.0
#: Move statuses during which a server counts as moving.
UNDER_WAY = (
    "accepted",
    "pre-migrating",
    "finished",
    "confirming",
    "preparing",
    "running",
    "post-migrating",
)


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    # Room for all twenty m1.tiny servers on one host, and for half of them on each other.
    return CloudConfig(
        computes=HOSTS,
        vcpus=24,
        memory_mb=16384,
        local_gb=40,
        env=(("KEEL_QUOTA__INSTANCES", "-1"), ("KEEL_QUOTA__CORES", "-1")),
    )


async def twenty_servers(cloud: Cloud) -> list[str]:
    posted = await asyncio.gather(
        *(cloud.post_server(f"drain-{i:02d}", host="dr-a") for i in range(SERVERS))
    )
    ids = [server["id"] for server in posted]

    async def all_active() -> bool:
        async with cloud.pool.acquire() as conn:
            active = await conn.fetchval(
                """SELECT count(*) FROM instances WHERE uuid = ANY($1::uuid[])
                      AND vm_state = 'active' AND task_state IS NULL AND host = 'dr-a'""",
                [UUID(i) for i in ids],
            )
        return bool(active == SERVERS)

    await wait_until(all_active, what="twenty servers ACTIVE on dr-a", timeout=120)
    for server_id in ids[:STOPPED]:
        cloud.openstack("server", "stop", server_id, as_json=False)

    async def stopped() -> bool:
        async with cloud.pool.acquire() as conn:
            found = await conn.fetchval(
                """SELECT count(*) FROM instances WHERE uuid = ANY($1::uuid[])
                      AND vm_state = 'stopped' AND task_state IS NULL""",
                [UUID(i) for i in ids],
            )
        return bool(found == STOPPED)

    await wait_until(stopped, what=f"{STOPPED} servers stopped", timeout=60)
    return ids


class Sampler:
    """Samples how many of the servers have a move under way, until stopped."""

    def __init__(self, cloud: Cloud, ids: list[str]) -> None:
        self.cloud = cloud
        self.ids = [UUID(i) for i in ids]
        self.most = 0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            async with self.cloud.pool.acquire() as conn:
                moving = await conn.fetchval(
                    """SELECT count(DISTINCT instance_uuid) FROM migrations
                        WHERE instance_uuid = ANY($1::uuid[]) AND status = ANY($2::text[])""",
                    self.ids,
                    list(UNDER_WAY),
                )
            self.most = max(self.most, moving)
            self.samples += 1
            await asyncio.sleep(0.1)

    def __enter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def moved(cloud: Cloud, ids: list[str]) -> int:
    async with cloud.pool.acquire() as conn:
        found: int = await conn.fetchval(
            """SELECT count(*) FROM instances WHERE uuid = ANY($1::uuid[])
                  AND host <> 'dr-a' AND vm_state IN ('active', 'stopped')
                  AND task_state IS NULL""",
            [UUID(i) for i in ids],
        )
    return found


def drain(cloud: Cloud, name: str) -> Process:
    return cloud.group.start(
        name,
        ["keel-manage", "host", "drain", "dr-a", "--parallel", str(PARALLEL), "--cold-fallback"],
        cloud.env,
    )


async def until_moved(cloud: Cloud, ids: list[str], count: int) -> None:
    async def enough() -> bool:
        return await moved(cloud, ids) >= count

    await wait_until(enough, what=f"{count} servers moved off dr-a", timeout=DRAIN_TIME)


async def until_said(process: Process, text: str) -> None:
    async def said() -> bool:
        return text in process.read_log()

    await wait_until(said, what=f"{process.name} saying {text!r}", timeout=60)


async def check_drained(cloud: Cloud, ids: list[str], task_id: int) -> None:
    """Every server on another host as it was (the stopped ones by cold migration, the
    others live), the host disabled by the task, the task done."""
    async with cloud.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT host, vm_state, task_state FROM instances WHERE uuid = ANY($1::uuid[])",
            [UUID(i) for i in ids],
        )
        kinds = await conn.fetch(
            """SELECT instance_uuid, migration_type FROM migrations
                WHERE instance_uuid = ANY($1::uuid[])""",
            [UUID(i) for i in ids],
        )
        service = await conn.fetchrow(
            """SELECT disabled, disabled_reason FROM services
                WHERE host = 'dr-a' AND "binary" = 'keel-compute'"""
        )
        task = await conn.fetchrow("SELECT status, message FROM host_tasks WHERE id = $1", task_id)
        items = await conn.fetch(
            "SELECT status, dest FROM host_task_items WHERE task_id = $1", task_id
        )
        tasks = await conn.fetchval("SELECT count(*) FROM host_tasks")
    assert sorted((r["vm_state"], r["task_state"]) for r in rows) == sorted(
        [("stopped", None)] * STOPPED + [("active", None)] * (SERVERS - STOPPED)
    )
    by_server = {str(k["instance_uuid"]): k["migration_type"] for k in kinds}
    assert len(kinds) == SERVERS, "each server moved once"
    assert {by_server[i] for i in ids[:STOPPED]} == {"migration"}
    assert {by_server[i] for i in ids[STOPPED:]} == {"live-migration"}
    assert {r["host"] for r in rows} <= {"dr-b", "dr-c"}
    assert service is not None
    assert service["disabled"]
    assert service["disabled_reason"].startswith(f"draining: host task {task_id} ")
    assert task is not None
    assert task["status"] == "done", task["message"]
    assert len(items) == SERVERS
    assert {(i["status"], i["dest"] in ("dr-b", "dr-c")) for i in items} == {("moved", True)}
    assert tasks == 1, "started three times, one task"


async def test_drain_moves_twenty_servers_resumes_and_survives_a_conductor(cloud: Cloud) -> None:
    ids = await twenty_servers(cloud)
    cloud.start("conductor2", "keel-conductor", "controller-2")
    began = time.monotonic()

    with Sampler(cloud, ids) as sampler:
        first = drain(cloud, "drain-1")
        await until_said(first, "started host task ")
        await until_moved(cloud, ids, 4)
        first.popen.send_signal(signal.SIGINT)  # Ctrl-C: the task goes on
        assert first.popen.wait(10) == 130, first.read_log()
        assert "stopped watching: host task" in first.read_log()
        started = re.search(r"started host task (\d+)", first.read_log())
        assert started, first.read_log()
        task_id = int(started.group(1))

        second = drain(cloud, "drain-2")
        await until_said(second, f"resuming host task {task_id} ")
        await until_moved(cloud, ids, 8)
        second.popen.send_signal(signal.SIGKILL)
        second.popen.wait(10)
        async with cloud.pool.acquire() as conn:
            assert await conn.fetchval("SELECT status FROM host_tasks WHERE id = $1", task_id) == (
                "running"
            ), "the task outlives the command"

        third = drain(cloud, "drain-3")
        await until_said(third, f"resuming host task {task_id} ")
        await until_moved(cloud, ids, 12)
        cloud.processes["conductor"].popen.send_signal(signal.SIGKILL)

        async def ended() -> bool:
            return third.popen.poll() is not None

        await wait_until(ended, what="keel-manage host drain ending", timeout=DRAIN_TIME)
    took = time.monotonic() - began

    log = third.read_log()
    assert third.popen.returncode == 0, log
    assert f"host task {task_id}: drain of dr-a: done: 20 server(s) moved off dr-a" in log
    assert sampler.most <= PARALLEL, f"{sampler.most} moving at once"
    assert sampler.most >= 2, "moves ran in parallel"
    assert sampler.samples > 20
    await check_drained(cloud, ids, task_id)
    # As the stock client sees them too.
    listed = {s["ID"]: s["Status"] for s in cloud.openstack("server", "list", "--long")}
    assert {listed[i] for i in ids[:STOPPED]} == {"SHUTOFF"}
    assert {listed[i] for i in ids[STOPPED:]} == {"ACTIVE"}
    print(f"drained {SERVERS} servers in {took:.0f}s, at most {sampler.most} moving at once")
    cloud.start("conductor", "keel-conductor")
