"""``keel-manage placement audit [--delete]`` on real PostgreSQL.

One world of servers, moves and claims holds every kind of justified claim (which must
not be listed), every kind of leak, claims held for an operator, and every kind of
missing claim; the audit must find exactly those.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg
import pytest

from shared.db import allocations, compute_nodes, placement_audit, services
from shared.db.placement_audit import Verdict
from shared.db.pool import Connection
from shared.objects.compute_node import NodeResources
from shared.objects.flavor import FlavorSnapshot
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.manage.test_manage import manage

pytestmark = pytest.mark.functional

TINY = FlavorSnapshot(flavorid="1", name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1)
FLAVOR_JSON = TINY.model_dump_json()


@dataclass
class World:
    nodes: dict[str, int] = field(default_factory=dict)
    servers: dict[str, UUID] = field(default_factory=dict)
    moves: dict[str, UUID] = field(default_factory=dict)
    #: (consumer, node id) of each leak, by name.
    leaks: dict[str, tuple[UUID, int]] = field(default_factory=dict)
    held: dict[str, tuple[UUID, int]] = field(default_factory=dict)
    #: (server, move or None, node id) of each missing claim, by name.
    missing: dict[str, tuple[UUID, UUID | None, int]] = field(default_factory=dict)


async def node(conn: Connection, host: str) -> int:
    service = await services.get_or_create(
        conn, host=host, binary="keel-compute", topic="compute", version=1, down_time=60
    )
    made = await compute_nodes.upsert(
        conn,
        node_uuid=uuid.uuid4(),
        service_id=service.id,
        host=host,
        resources=NodeResources(
            hypervisor_hostname=host,
            vcpus=64,
            memory_mb=65536,
            local_gb=1000,
            cpu_allocation_ratio=1.0,
            ram_allocation_ratio=1.0,
            disk_allocation_ratio=1.0,
        ),
    )
    return made.id


async def server(
    conn: Connection,
    node_id: int | None,
    *,
    vm_state: str = "active",
    launched: bool = True,
    deleted: bool = False,
    legacy_host: str | None = None,
) -> UUID:
    """A server row as keel leaves it; ``legacy_host``: as release 1 wrote it (names only)."""
    server_uuid = uuid.uuid4()
    host = legacy_host or await conn.fetchval(
        "SELECT host FROM compute_nodes WHERE id = $1", node_id
    )
    await conn.execute(
        """INSERT INTO instances (uuid, project_id, user_id, display_name, host, node,
                                  vm_state, flavor, compute_id, launched_at, deleted_at)
           VALUES ($1, 'p', 'u', 'vm', $2, $2, $3, $4::jsonb, $5,
                   CASE WHEN $6 THEN now() END, CASE WHEN $7 THEN now() END)""",
        server_uuid,
        host,
        vm_state,
        FLAVOR_JSON,
        None if legacy_host else node_id,
        launched,
        deleted,
    )
    return server_uuid


async def move(
    conn: Connection,
    server_uuid: UUID,
    kind: str,
    status: str,
    *,
    source: int | None,
    dest: int | None,
) -> UUID:
    move_uuid = uuid.uuid4()
    await conn.execute(
        """INSERT INTO migrations (uuid, instance_uuid, migration_type, status,
                                   source_compute_id, dest_compute_id)
           VALUES ($1, $2, $3, $4, $5, $6)""",
        move_uuid,
        server_uuid,
        kind,
        status,
        source,
        dest,
    )
    return move_uuid


async def claim(conn: Connection, node_id: int, consumer: UUID, server_uuid: UUID) -> None:
    assert await allocations.claim(conn, node_id, consumer, TINY, instance_uuid=server_uuid)


async def add_justified(conn: Connection) -> World:
    """Nodes, and one claim of each kind a live server or move justifies."""
    w = World()
    w.nodes = {host: await node(conn, host) for host in ("a", "b", "c", "gone")}
    a, b, c, gone = (w.nodes[host] for host in ("a", "b", "c", "gone"))

    # -- justified: never listed ----------------------------------------------
    s = w.servers
    s["active"] = await server(conn, a)
    await claim(conn, a, s["active"], s["active"])
    s["building"] = await server(conn, None, vm_state="building", launched=False)
    await claim(conn, b, s["building"], s["building"])  # scheduled, not yet recorded
    s["evacuated"] = await server(conn, b)
    w.moves["evac-done"] = await move(conn, s["evacuated"], "evacuation", "done", source=a, dest=b)
    await claim(conn, b, s["evacuated"], s["evacuated"])
    await claim(conn, a, s["evacuated"], s["evacuated"])  # until the source confirms
    s["resized"] = await server(conn, c, vm_state="resized")
    w.moves["finished"] = await move(conn, s["resized"], "migration", "finished", source=a, dest=c)
    await claim(conn, c, w.moves["finished"], s["resized"])
    await claim(conn, a, s["resized"], s["resized"])  # what a revert returns to
    s["evacuating"] = await server(conn, a)
    w.moves["pre-migrating"] = await move(
        conn, s["evacuating"], "evacuation", "pre-migrating", source=a, dest=b
    )
    await claim(conn, a, s["evacuating"], s["evacuating"])
    await claim(conn, b, w.moves["pre-migrating"], s["evacuating"])
    s["migrating"] = await server(conn, a)
    w.moves["accepted"] = await move(
        conn, s["migrating"], "migration", "accepted", source=a, dest=None
    )
    await claim(conn, a, s["migrating"], s["migrating"])
    await claim(conn, c, w.moves["accepted"], s["migrating"])  # destination not recorded yet
    s["legacy"] = await server(conn, None, legacy_host="a")
    await claim(conn, a, s["legacy"], s["legacy"])
    s["build-failed"] = await server(conn, a, vm_state="error", launched=False)
    s["gone-source"] = await server(conn, b)
    await claim(conn, b, s["gone-source"], s["gone-source"])
    await move(conn, s["gone-source"], "evacuation", "done", source=gone, dest=b)
    # The source host was deleted for good (its claims released with it).
    await conn.execute("UPDATE compute_nodes SET deleted_at = now() WHERE id = $1", gone)

    return w


async def add_held(conn: Connection, w: World) -> None:
    """A confirm an agent could not do: both claims held for an operator."""
    a, c, s = w.nodes["a"], w.nodes["c"], w.servers
    s["stuck"] = await server(conn, c, vm_state="error")
    w.moves["error"] = await move(conn, s["stuck"], "migration", "error", source=a, dest=c)
    await claim(conn, c, w.moves["error"], s["stuck"])
    await claim(conn, a, s["stuck"], s["stuck"])
    w.held = {"error-dest": (w.moves["error"], c), "error-source": (s["stuck"], a)}


async def add_leaks(conn: Connection, w: World) -> None:
    """One claim of each kind no live server or move justifies."""
    a, b, c, s = w.nodes["a"], w.nodes["b"], w.nodes["c"], w.servers
    s["deleted"] = await server(conn, a, deleted=True)
    await claim(conn, a, s["deleted"], s["deleted"])
    w.leaks["deleted-server"] = (s["deleted"], a)
    ghost = uuid.uuid4()
    await claim(conn, b, ghost, ghost)
    w.leaks["unknown-server"] = (ghost, b)
    await claim(conn, b, s["active"], s["active"])
    w.leaks["not-its-node"] = (s["active"], b)
    s["confirmed"] = await server(conn, c)
    w.moves["confirmed"] = await move(
        conn, s["confirmed"], "migration", "confirmed", source=a, dest=c
    )
    await claim(conn, c, s["confirmed"], s["confirmed"])
    await claim(conn, c, w.moves["confirmed"], s["confirmed"])
    w.leaks["ended-move"] = (w.moves["confirmed"], c)
    s["completed"] = await server(conn, b)
    await move(conn, s["completed"], "evacuation", "completed", source=a, dest=b)
    await claim(conn, b, s["completed"], s["completed"])
    await claim(conn, a, s["completed"], s["completed"])
    w.leaks["confirmed-source"] = (s["completed"], a)
    await claim(conn, b, w.moves["finished"], s["resized"])
    w.leaks["not-its-destination"] = (w.moves["finished"], b)
    s["failed"] = await server(conn, a, vm_state="error")
    w.moves["failed"] = await move(conn, s["failed"], "evacuation", "failed", source=a, dest=b)
    await claim(conn, a, s["failed"], s["failed"])
    await claim(conn, b, w.moves["failed"], s["failed"])
    w.leaks["failed-move"] = (w.moves["failed"], b)


async def add_missing(conn: Connection, w: World) -> None:
    """A server and moves, each without a claim it needs."""
    a, b, c, s = w.nodes["a"], w.nodes["b"], w.nodes["c"], w.servers
    s["unclaimed"] = await server(conn, a)
    w.missing["server"] = (s["unclaimed"], None, a)
    s["no-destination"] = await server(conn, a)
    await claim(conn, a, s["no-destination"], s["no-destination"])
    w.moves["no-destination"] = await move(
        conn, s["no-destination"], "migration", "pre-migrating", source=a, dest=b
    )
    w.missing["destination"] = (s["no-destination"], w.moves["no-destination"], b)
    s["no-source"] = await server(conn, c, vm_state="resized")
    w.moves["no-source"] = await move(
        conn, s["no-source"], "migration", "finished", source=a, dest=c
    )
    await claim(conn, c, w.moves["no-source"], s["no-source"])
    w.missing["source"] = (s["no-source"], w.moves["no-source"], a)


@pytest.fixture
async def world(db_pool: asyncpg.Pool) -> World:
    async with db_pool.acquire() as conn:
        made = await add_justified(conn)
        await add_held(conn, made)
        await add_leaks(conn, made)
        await add_missing(conn, made)
    return made


Gap = tuple[UUID, UUID | None, int]


async def found(pool: asyncpg.Pool) -> tuple[dict[Verdict, set[tuple[UUID, int]]], set[Gap]]:
    async with pool.acquire() as conn:
        claims = await placement_audit.unjustified(conn)
        gaps = await placement_audit.missing(conn)
    by_verdict: dict[Verdict, set[tuple[UUID, int]]] = {Verdict.LEAK: set(), Verdict.HELD: set()}
    for c in claims:
        by_verdict[c.verdict].add((c.allocation.consumer_uuid, c.allocation.compute_node_id))
    return by_verdict, {(g.instance_uuid, g.migration_uuid, g.node_id) for g in gaps}


async def claims_of(pool: asyncpg.Pool) -> set[tuple[UUID, int]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT consumer_uuid, compute_node_id FROM allocations")
    return {(row["consumer_uuid"], row["compute_node_id"]) for row in rows}


async def drift(pool: asyncpg.Pool) -> list[allocations.UsageDrift]:
    async with pool.acquire() as conn:
        return await allocations.usage_drift(conn)


async def test_the_audit_finds_every_leak_held_claim_and_missing_claim_and_nothing_else(
    db_pool: asyncpg.Pool, world: World
) -> None:
    claims, gaps = await found(db_pool)

    assert claims[Verdict.LEAK] == set(world.leaks.values())
    assert claims[Verdict.HELD] == set(world.held.values())
    assert gaps == set(world.missing.values())


async def test_the_command_lists_then_deletes_the_leaks_only(
    database_url: str, db_pool: asyncpg.Pool, world: World
) -> None:
    before = await claims_of(db_pool)

    listed = manage(database_url, "placement", "audit")

    assert listed.returncode == 1, listed.stdout + listed.stderr
    assert "7 claim(s) no live server or move justifies:" in listed.stdout
    assert f"consumer {world.servers['deleted']}" in listed.stdout
    assert "its server was deleted" in listed.stdout
    assert "2 claim(s) held for an operator" in listed.stdout
    assert "3 server(s) or move(s) missing their claims:" in listed.stdout
    assert f"server {world.servers['unclaimed']} on compute node" in listed.stdout
    assert await claims_of(db_pool) == before

    deleted = manage(database_url, "placement", "audit", "--delete")

    assert deleted.returncode == 1, deleted.stdout + deleted.stderr  # missing claims remain
    assert deleted.stdout.count(" — removed") == 7
    assert await claims_of(db_pool) == before - set(world.leaks.values())
    assert await drift(db_pool) == []
    again = manage(database_url, "placement", "audit")
    assert "0 claim(s) no live server or move justifies." in again.stdout
    assert "2 claim(s) held for an operator" in again.stdout


async def test_a_clean_cloud_is_exit_0(database_url: str, db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        a = await node(conn, "a")
        kept = await server(conn, a)
        await claim(conn, a, kept, kept)

    result = manage(database_url, "placement", "audit", "--delete")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 claim(s) no live server or move justifies." in result.stdout
    assert "0 server(s) or move(s) missing their claims." in result.stdout


async def test_a_leak_justified_again_before_it_is_deleted_stays(
    db_pool: asyncpg.Pool, world: World
) -> None:
    async with db_pool.acquire() as conn:
        listed = await placement_audit.unjustified(conn)
        # The server moves to the node its extra claim is on before the delete runs.
        await conn.execute(
            "UPDATE instances SET compute_id = $2 WHERE uuid = $1",
            world.servers["active"],
            world.nodes["b"],
        )
        outcomes = {
            (
                c.allocation.consumer_uuid,
                c.allocation.compute_node_id,
            ): await placement_audit.release_leak(conn, c)
            for c in listed
            if c.verdict is Verdict.LEAK
        }
    assert outcomes[world.leaks["not-its-node"]] is None
    assert world.leaks["not-its-node"] in await claims_of(db_pool)
    assert all(v is not None for k, v in outcomes.items() if k != world.leaks["not-its-node"])


async def test_two_deletes_at_once_release_each_leak_once(
    db_pool: asyncpg.Pool, world: World
) -> None:
    before = await claims_of(db_pool)
    async with db_pool.acquire() as conn:
        leaks = [c for c in await placement_audit.unjustified(conn) if c.verdict is Verdict.LEAK]

    async def delete_all() -> int:
        async with db_pool.acquire() as conn:
            return sum([await placement_audit.release_leak(conn, c) is not None for c in leaks])

    counts = await asyncio.gather(delete_all(), delete_all())

    assert sum(counts) == len(world.leaks)
    assert await claims_of(db_pool) == before - set(world.leaks.values())
    assert await drift(db_pool) == []


@pytest.mark.parametrize("cut_after", [b"DELETE FROM allocations", b"COMMIT"])
async def test_a_delete_cut_off_once_is_whole_or_absent_and_can_be_repeated(
    db_pool: asyncpg.Pool, world: World, database_url: str, pg_proxy: TcpProxy, cut_after: bytes
) -> None:
    before = await claims_of(db_pool)
    async with db_pool.acquire() as conn:
        [leak] = [
            c
            for c in await placement_audit.unjustified(conn)
            if (c.allocation.consumer_uuid, c.allocation.compute_node_id)
            == world.leaks["deleted-server"]
        ]
    cut_off = await asyncpg.connect(url_through(database_url, pg_proxy.address))
    pg_proxy.cut_after(cut_after)
    try:
        with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError)):
            await placement_audit.release_leak(cut_off, leak)
    finally:
        cut_off.terminate()

    after = await claims_of(db_pool)
    assert after in (before, before - {world.leaks["deleted-server"]})
    assert await drift(db_pool) == []
    await pg_proxy.restore()
    async with db_pool.acquire() as conn:
        repeated = await placement_audit.release_leak(conn, leak)
    assert (repeated is None) == (after != before)
    assert await claims_of(db_pool) == before - {world.leaks["deleted-server"]}
    assert await drift(db_pool) == []
