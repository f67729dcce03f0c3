"""Host tasks: the conductors' sweep over drains and evacuations, on real PostgreSQL.

Hosts, servers and heartbeats are rows as agents and keel-api would have left them; the
sweep's casts go to a recording conductor client, and the test carries each recorded
move out in SQL as the move workflow would (the e2e tier runs the real one). Sweeps run
twice at once, as two conductors run them, and through a database connection cut once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg
import pytest

from services.compute.rpcapi import RPC_VERSION as COMPUTE_RPC_VERSION
from services.compute.rpcapi import ComputeAPI
from services.conductor.host_tasks.sweep import HostTasks
from services.conductor.live_rpc import LiveConductorAPI
from services.conductor.rpcapi import ConductorAPI
from shared import host_task_requests
from shared.config import DatabaseSettings, FencingSettings, RpcSettings, Settings
from shared.context import RequestContext
from shared.db import compute_nodes, host_tasks, instances, services
from shared.db.pool import create_pool
from shared.exceptions import Conflict, HostTaskRefused, KeelError
from shared.host_task_requests import TaskRequest
from shared.objects.host_task import HostTask, TaskKind
from shared.rpc.fake import FakeTransport
from shared.versions import SERVICE_VERSION
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.conductor.stand_in import create_instance, resources

pytestmark = pytest.mark.functional

DOWN, FENCE, MARGIN = 4.0, 8.0, 2.0
FENCED = FENCE + MARGIN + 1
ADMIN = RequestContext(user_id="operator", project_id="ops", roles=("admin",))


class RecordingLive(LiveConductorAPI):
    """Records the live migrations cast (by migration uuid)."""

    def __init__(self, conductor: ConductorAPI) -> None:
        super().__init__(conductor.client)
        self.cast: list[UUID] = []

    async def live_migrate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        self.cast.append(migration_uuid)


class RecordingConductor(ConductorAPI):
    """Records the moves and confirms cast (by migration uuid)."""

    def __init__(self) -> None:
        super().__init__(FakeTransport())
        self.migrations: list[UUID] = []
        self.evacuations: list[UUID] = []
        self.confirms: list[UUID] = []
        self.live: RecordingLive = RecordingLive(self)

    async def migrate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        self.migrations.append(migration_uuid)

    async def evacuate_instance(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        self.evacuations.append(migration_uuid)

    async def confirm_migration(self, ctx: RequestContext, migration_uuid: UUID) -> None:
        self.confirms.append(migration_uuid)


def settings(call_timeout: float = 10.0) -> Settings:
    return Settings(
        service_down_time=DOWN,
        report_interval=1,
        fencing=FencingSettings(margin=MARGIN),
        rpc=RpcSettings(call_timeout=call_timeout),
    )


#: The compute RPC cap of a deployment whose agents do not all speak live migration.
BEFORE_LIVE = "1.15"


@dataclass
class World:
    pool: asyncpg.Pool
    #: The compute RPC cap the sweeps see (the deployment's agents).
    compute_cap: str = COMPUTE_RPC_VERSION
    conductor: RecordingConductor = field(default_factory=RecordingConductor)
    nodes: dict[str, int] = field(default_factory=dict)

    def sweep(self, pool: asyncpg.Pool | None = None, call_timeout: float = 10.0) -> HostTasks:
        """A conductor's sweep (each call: another conductor)."""
        compute = ComputeAPI(FakeTransport(), version_cap=self.compute_cap)
        return HostTasks(pool or self.pool, self.conductor, compute, settings(call_timeout))

    async def host(self, name: str) -> int:
        """A compute host of this release, its fence armed, up; its node's id."""
        async with self.pool.acquire() as conn:
            service = await services.get_or_create(
                conn,
                host=name,
                binary="keel-compute",
                topic="compute",
                version=SERVICE_VERSION,
                down_time=DOWN,
                registering=True,
                self_fence_after=FENCE,
            )
            await services.heartbeat(
                conn,
                service.uuid,
                SERVICE_VERSION,
                agent=True,
                self_fence_after=FENCE,
                fence_lease=FENCE,
            )
            node = await compute_nodes.upsert(
                conn,
                node_uuid=uuid.uuid4(),
                service_id=service.id,
                host=name,
                resources=resources(name),
            )
        self.nodes[name] = node.id
        return node.id

    async def servers(self, host: str, count: int, vm_state: str = "active") -> list[UUID]:
        """``count`` servers on ``host``, ACTIVE unless ``vm_state`` says otherwise."""
        made = []
        for _ in range(count):
            server = await create_instance(self.pool)
            async with self.pool.acquire() as conn:
                node = await compute_nodes.get_by_id(conn, self.nodes[host])
                await instances.set_scheduled(
                    conn, server, host=host, node=node.hypervisor_hostname, compute_id=node.id
                )
                await instances.set_active(conn, server)
                await conn.execute(
                    "UPDATE instances SET vm_state = $2 WHERE uuid = $1", server, vm_state
                )
            made.append(server)
        return made

    async def silent(self, name: str, seconds: float, *, fence: float | None = FENCE) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                """UPDATE services SET last_seen_up = now() - make_interval(secs => $2),
                                       fence_lease = $3
                    WHERE host = $1 AND "binary" = 'keel-compute'""",
                name,
                seconds,
                fence,
            )

    async def start(self, kind: TaskKind, host: str, **options: object) -> HostTask:
        request = TaskRequest(kind=kind, host=host, **options)  # type: ignore[arg-type]
        async with self.pool.acquire() as conn:
            task, _ = await host_task_requests.start(
                conn, ADMIN, request, down_time=DOWN, margin=MARGIN
            )
        return task

    async def carry_out(self, dest: str, *, fail: UUID | None = None) -> None:
        """Every recorded move as the workflow would carry it out: cold migrations to
        ``finished`` on ``dest`` (or ``error``, for server ``fail``), confirms to
        ``confirmed``, evacuations to ``done``, live migrations to ``completed``."""
        async with self.pool.acquire() as conn, conn.transaction():
            node = await compute_nodes.get_by_id(conn, self.nodes[dest])
            failed = await conn.fetch(
                """UPDATE migrations SET status = 'error', updated_at = now()
                    WHERE status = 'accepted' AND instance_uuid = $1 RETURNING instance_uuid""",
                fail,
            )
            for row in failed:
                await conn.execute(
                    "UPDATE instances SET task_state = NULL WHERE uuid = $1", row["instance_uuid"]
                )
                await conn.execute(
                    """UPDATE instance_actions SET message = 'No valid host was found.',
                              finish_time = now() WHERE instance_uuid = $1""",
                    row["instance_uuid"],
                )
            moved = await conn.fetch(
                """UPDATE migrations SET status = CASE migration_type
                          WHEN 'evacuation' THEN 'done' WHEN 'live-migration' THEN 'completed'
                          ELSE 'finished' END,
                          dest_compute = $1, dest_compute_id = $2, updated_at = now()
                    WHERE status = 'accepted' RETURNING instance_uuid, migration_type""",
                dest,
                node.id,
            )
            for row in moved:
                vm = {"evacuation": "active", "migration": "resized"}.get(row["migration_type"])
                await conn.execute(
                    """UPDATE instances SET task_state = NULL, vm_state = COALESCE($2, vm_state),
                              host = $3, compute_id = $4 WHERE uuid = $1""",
                    row["instance_uuid"],
                    vm,
                    dest,
                    node.id,
                )
            confirmed = await conn.fetch(
                """UPDATE migrations SET status = 'confirmed', updated_at = now()
                    WHERE status = 'confirming' RETURNING instance_uuid"""
            )
            for row in confirmed:
                await conn.execute(
                    "UPDATE instances SET task_state = NULL, vm_state = 'active' WHERE uuid = $1",
                    row["instance_uuid"],
                )

    async def moving(self, task: HostTask) -> int:
        async with self.pool.acquire() as conn:
            return (await host_tasks.counts(conn, [task.id]))[task.id].moving

    async def task(self, task: HostTask) -> HostTask:
        async with self.pool.acquire() as conn:
            return await host_tasks.get_by_id(conn, task.id)

    async def migrations_per_server(self) -> dict[UUID, int]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT instance_uuid, count(*) AS n FROM migrations GROUP BY instance_uuid"
            )
        return {row["instance_uuid"]: row["n"] for row in rows}


@pytest.fixture
def world(db_pool: asyncpg.Pool) -> World:
    """A deployment whose agents do not speak live migration: drains move cold."""
    return World(db_pool, compute_cap=BEFORE_LIVE)


@pytest.fixture
def live_world(db_pool: asyncpg.Pool) -> World:
    """A deployment of this release: drains move servers live where they can."""
    return World(db_pool)


async def drained(world: World, task: HostTask, dest: str, *, rounds: int = 40) -> HostTask:
    """Sweep and carry out until the task ends; the bound on moving checked at each step."""
    for _ in range(rounds):
        await world.sweep().sweep()
        assert await world.moving(task) <= task.parallel
        await world.carry_out(dest)
        task = await world.task(task)
        if not task.running:
            return task
    raise AssertionError(f"host task {task.id} still running: {task.message}")


async def test_a_drain_disables_the_host_then_moves_every_server_confirming_each(
    world: World,
) -> None:
    await world.host("src")
    await world.host("dst")
    servers = await world.servers("src", 5)
    task = await world.start(TaskKind.DRAIN, "src", parallel=2, cold_fallback=True)

    await world.sweep().sweep()
    async with world.pool.acquire() as conn:
        service = await services.find_compute(conn, "src", DOWN)
    assert service is not None
    assert service.disabled
    assert service.disabled_reason == f"draining: host task {task.id} ({task.uuid})"
    assert len(world.conductor.migrations) == 2, "at most parallel moves at once"

    ended = await drained(world, task, "dst")

    assert ended.status == "done", ended.message
    assert "5 server(s) moved off src" in (ended.message or "")
    async with world.pool.acquire() as conn:
        items = await host_tasks.items(conn, task.id)
        hosts = {s: (await instances.get(conn, s)).host for s in servers}
        actions = await conn.fetch(
            "SELECT user_id FROM instance_actions WHERE action = 'confirmResize'"
        )
    assert {(i.instance_uuid, i.status, i.dest) for i in items} == {
        (s, "moved", "dst") for s in servers
    }
    assert set(hosts.values()) == {"dst"}
    assert len(world.conductor.confirms) == 5, "the task confirmed each, as its owner would"
    assert {row["user_id"] for row in actions} == {"operator"}


async def test_starting_twice_resumes_the_same_task_and_the_other_kind_is_refused(
    world: World,
) -> None:
    await world.host("src")
    await world.host("other")
    first = await world.start(TaskKind.DRAIN, "src", cold_fallback=True, parallel=3)
    again = await world.start(TaskKind.DRAIN, "src", cold_fallback=True, parallel=7)
    assert again.id == first.id
    assert again.parallel == 3

    with pytest.raises(Conflict, match=f"host task {first.id} \\(drain\\) runs on it"):
        await world.start(TaskKind.EVACUATE, "src")
    with pytest.raises(HostTaskRefused, match="parallel must be between"):
        await world.start(TaskKind.DRAIN, "other", parallel=0)


async def test_two_sweeps_at_once_start_each_move_once_within_the_bound(world: World) -> None:
    await world.host("src")
    await world.host("dst")
    servers = await world.servers("src", 6)
    task = await world.start(TaskKind.DRAIN, "src", parallel=3, cold_fallback=True)
    one, two = world.sweep(), world.sweep()

    for _ in range(12):
        # Past the leases: both work on the task in the same instant.
        current = await world.task(task)
        await asyncio.gather(one.advance(current), two.advance(current))
        assert await world.moving(task) <= 3
        await world.carry_out("dst")
        if not (await world.task(task)).running:
            break

    assert (await world.task(task)).status == "done"
    assert await world.migrations_per_server() == {s: 1 for s in servers}
    assert len(world.conductor.migrations) == 6
    assert len(world.conductor.confirms) == 6


@pytest.fixture
async def proxied_pool(database_url: str, pg_proxy: TcpProxy) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(
        url_through(database_url, pg_proxy.address), DatabaseSettings(connect_timeout=5)
    )
    yield pool
    await pool.close()


@pytest.fixture(params=["cold", "live"])
def either_world(request: pytest.FixtureRequest, db_pool: asyncpg.Pool) -> World:
    """A deployment whose drains move cold, then one whose drains move live."""
    return World(
        db_pool, compute_cap=BEFORE_LIVE if request.param == "cold" else COMPUTE_RPC_VERSION
    )


@pytest.mark.parametrize("cut_after", [b"INSERT INTO migrations", b"COMMIT"])
async def test_a_sweep_whose_database_call_fails_once_loses_or_keeps_the_move_whole(
    either_world: World, proxied_pool: asyncpg.Pool, pg_proxy: TcpProxy, cut_after: bytes
) -> None:
    world = either_world
    await world.host("src")
    await world.host("dst")
    servers = await world.servers("src", 2)
    task = await world.start(TaskKind.DRAIN, "src", parallel=2, cold_fallback=True)
    pg_proxy.cut_after(cut_after)

    with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError, KeelError)):
        await world.sweep(proxied_pool).advance(await world.task(task))

    await pg_proxy.restore()
    async with world.pool.acquire() as conn:
        items = {i.instance_uuid: i for i in await host_tasks.items(conn, task.id)}
    recorded = await world.migrations_per_server()
    # Each move is recorded with its item claimed, or neither is.
    for server in servers:
        claimed = server in items and items[server].status == "moving"
        assert recorded.get(server, 0) == int(claimed), (server, items.get(server))
    # A move recorded but never cast (cut after its COMMIT) is cast again once stalled.
    ended = None
    for _ in range(20):
        await world.sweep(call_timeout=0.05).sweep()
        await world.carry_out("dst")
        ended = await world.task(task)
        if not ended.running:
            break
        await asyncio.sleep(0.1)
    assert ended is not None
    assert ended.status == "done", ended
    assert await world.migrations_per_server() == {s: 1 for s in servers}


async def test_evacuate_waits_or_refuses_as_the_hosts_fence_says(world: World) -> None:
    await world.host("up")
    await world.host("unfenced")
    await world.host("lease")
    await world.host("dst")
    servers = await world.servers("lease", 2)

    with pytest.raises(HostTaskRefused, match="Compute service of up is still in use"):
        await world.start(TaskKind.EVACUATE, "up")
    await world.silent("unfenced", 60, fence=None)
    with pytest.raises(HostTaskRefused, match="force its service down"):
        await world.start(TaskKind.EVACUATE, "unfenced")

    await world.silent("lease", DOWN + 1)  # down, its fence's lease still running
    task = await world.start(TaskKind.EVACUATE, "lease")
    await world.sweep().sweep()
    waiting = await world.task(task)
    assert waiting.running
    assert world.conductor.evacuations == []
    assert (waiting.message or "").startswith("waiting: Compute service of lease is down but")

    await world.silent("lease", FENCED)
    ended = await drained(world, task, "dst")
    assert ended.status == "done", ended.message
    assert len(world.conductor.evacuations) == 2
    async with world.pool.acquire() as conn:
        users = await conn.fetch(
            "SELECT DISTINCT user_id FROM migrations WHERE migration_type = 'evacuation'"
        )
        hosts = {(await instances.get(conn, s)).host for s in servers}
    assert [row["user_id"] for row in users] == ["operator"]
    assert hosts == {"dst"}


async def test_an_evacuation_whose_host_comes_back_up_fails_saying_why(world: World) -> None:
    await world.host("back")
    await world.servers("back", 1)
    await world.silent("back", DOWN + 1)
    task = await world.start(TaskKind.EVACUATE, "back")
    await world.silent("back", 0)

    await world.sweep().sweep()

    ended = await world.task(task)
    assert ended.status == "failed"
    assert ended.message == "Compute service of back is still in use."


async def test_a_task_past_its_deadline_fails_with_what_is_left(world: World) -> None:
    await world.host("src")
    await world.host("dst")
    await world.servers("src", 3)
    task = await world.start(TaskKind.DRAIN, "src", parallel=1, cold_fallback=True)
    await world.sweep().sweep()
    await world.carry_out("dst")
    await world.sweep().sweep()  # confirms the first
    await world.carry_out("dst")
    await world.sweep().sweep()  # the first moved, the second started
    async with world.pool.acquire() as conn:
        await conn.execute("UPDATE host_tasks SET deadline = now() - interval '1 s'")

    await world.sweep().sweep()

    ended = await world.task(task)
    assert ended.status == "failed"
    assert (ended.message or "").startswith("its deadline passed with 2 of 3 server(s) not moved")
    async with world.pool.acquire() as conn:
        items = await host_tasks.items(conn, task.id)
    outcomes = sorted((i.status, (i.message or "").split(":")[0]) for i in items)
    assert outcomes == [
        ("failed", "not moved before the task's deadline"),
        ("failed", "still moving when the task ended"),
        ("moved", "moved by cold migration"),
    ]


async def test_a_move_that_fails_is_kept_with_its_reason_and_the_task_fails(world: World) -> None:
    await world.host("src")
    await world.host("dst")
    bad, good = await world.servers("src", 2)
    task = await world.start(TaskKind.DRAIN, "src", parallel=2, cold_fallback=True)
    await world.sweep().sweep()
    await world.carry_out("dst", fail=bad)

    ended = await drained(world, task, "dst")

    assert ended.status == "failed"
    assert "1 of 2 server(s) could not be moved off src" in (ended.message or "")
    async with world.pool.acquire() as conn:
        items = {i.instance_uuid: i for i in await host_tasks.items(conn, task.id)}
    assert (items[bad].status, items[bad].message) == ("failed", "No valid host was found.")
    assert items[good].status == "moved"


async def items_by_server(world: World, task: HostTask) -> dict[UUID, tuple[str, str]]:
    async with world.pool.acquire() as conn:
        found = await host_tasks.items(conn, task.id)
    return {i.instance_uuid: (i.status, i.message or "") for i in found}


async def test_a_drain_moves_running_servers_live_and_a_stopped_one_cold(
    live_world: World,
) -> None:
    world = live_world
    await world.host("src")
    await world.host("dst")
    running = await world.servers("src", 3) + await world.servers("src", 1, vm_state="paused")
    (stopped,) = await world.servers("src", 1, vm_state="stopped")
    task = await world.start(TaskKind.DRAIN, "src", parallel=2, cold_fallback=True)

    ended = await drained(world, task, "dst")

    assert ended.status == "done", ended.message
    assert sorted(world.conductor.live.cast) == sorted(
        await migration_uuids(world, "live-migration")
    )
    assert len(world.conductor.live.cast) == 4
    assert len(world.conductor.migrations) == 1, "only the stopped server moved cold"
    assert len(world.conductor.confirms) == 1, "a live migration has nothing to confirm"
    outcomes = await items_by_server(world, task)
    assert {outcomes[s] for s in running} == {("moved", "moved by live migration")}
    assert outcomes[stopped] == ("moved", "moved by cold migration")
    assert await world.migrations_per_server() == {s: 1 for s in [*running, stopped]}


async def migration_uuids(world: World, migration_type: str) -> list[UUID]:
    async with world.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT uuid FROM migrations WHERE migration_type = $1", migration_type
        )
    return [row["uuid"] for row in rows]


async def test_without_cold_fallback_what_cannot_move_live_stays_and_the_task_says_why(
    live_world: World,
) -> None:
    world = live_world
    await world.host("src")
    await world.host("dst")
    (live,) = await world.servers("src", 1)
    (stopped,) = await world.servers("src", 1, vm_state="stopped")
    (suspended,) = await world.servers("src", 1, vm_state="suspended")
    task = await world.start(TaskKind.DRAIN, "src", parallel=3)

    ended = await drained(world, task, "dst")

    assert ended.status == "failed"
    assert "2 of 3 server(s) could not be moved off src" in (ended.message or "")
    outcomes = await items_by_server(world, task)
    assert outcomes[live] == ("moved", "moved by live migration")
    assert outcomes[stopped] == (
        "failed",
        "its vm_state is stopped: a live migration moves only servers in active, paused; "
        "cold migration was not allowed (cold_fallback)",
    )
    assert outcomes[suspended][0] == "failed"
    assert world.conductor.migrations == []


@pytest.mark.parametrize("cold_fallback", [True, False])
async def test_a_live_migration_that_fails_moves_the_server_cold_only_if_allowed(
    live_world: World, cold_fallback: bool
) -> None:
    world = live_world
    await world.host("src")
    await world.host("dst")
    bad, good = await world.servers("src", 2)
    task = await world.start(TaskKind.DRAIN, "src", parallel=2, cold_fallback=cold_fallback)
    await world.sweep().sweep()
    await world.carry_out("dst", fail=bad)

    ended = await drained(world, task, "dst")

    outcomes = await items_by_server(world, task)
    assert outcomes[good] == ("moved", "moved by live migration")
    assert len(world.conductor.live.cast) == 2, "each server's live migration is tried once"
    if cold_fallback:
        assert ended.status == "done", ended.message
        assert outcomes[bad] == ("moved", "moved by cold migration")
        assert await world.migrations_per_server() == {bad: 2, good: 1}
    else:
        assert ended.status == "failed"
        status, message = outcomes[bad]
        assert status == "failed"
        assert "did not arrive (No valid host was found.)" in message
        assert message.endswith("cold migration was not allowed (cold_fallback)")
        assert await world.migrations_per_server() == {bad: 1, good: 1}


async def test_an_aborted_live_migration_moves_the_server_cold(live_world: World) -> None:
    world = live_world
    await world.host("src")
    await world.host("dst")
    (server,) = await world.servers("src", 1)
    task = await world.start(TaskKind.DRAIN, "src", cold_fallback=True)
    await world.sweep().sweep()
    async with world.pool.acquire() as conn:  # aborted: ended, the server where it was
        await conn.execute("UPDATE migrations SET status = 'cancelled', updated_at = now()")
        await conn.execute("UPDATE instances SET task_state = NULL WHERE uuid = $1", server)

    ended = await drained(world, task, "dst")

    assert ended.status == "done", ended.message
    assert (await items_by_server(world, task))[server] == ("moved", "moved by cold migration")
    assert await world.migrations_per_server() == {server: 2}


async def test_a_deployment_not_speaking_live_migration_drains_cold_or_says_why(
    world: World,
) -> None:
    await world.host("src")
    await world.host("dst")
    (server,) = await world.servers("src", 1)
    task = await world.start(TaskKind.DRAIN, "src")

    ended = await drained(world, task, "dst")

    assert ended.status == "failed"
    status, message = (await items_by_server(world, task))[server]
    assert status == "failed"
    assert message.startswith("live migration needs every keel-compute at release yawl")
    assert world.conductor.live.cast == []
    assert world.conductor.migrations == []


async def test_two_sweeps_at_once_start_each_live_migration_once(live_world: World) -> None:
    world = live_world
    await world.host("src")
    await world.host("dst")
    servers = await world.servers("src", 5)
    task = await world.start(TaskKind.DRAIN, "src", parallel=2)
    one, two = world.sweep(), world.sweep()

    for _ in range(12):
        current = await world.task(task)
        await asyncio.gather(one.advance(current), two.advance(current))
        assert await world.moving(task) <= 2
        await world.carry_out("dst")
        if not (await world.task(task)).running:
            break

    assert (await world.task(task)).status == "done"
    assert await world.migrations_per_server() == {s: 1 for s in servers}
    assert len(world.conductor.live.cast) == 5
