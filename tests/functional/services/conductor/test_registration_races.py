"""Registration and rename are compare-and-swaps: racing pairs on real PostgreSQL.

Each race is run twice over: once with the interleaving forced (the first party holds
its transaction, or a table lock, until the second is seen waiting in PostgreSQL), and
once simply at the same time, several hosts at once. Either way one party wins, the
other is refused with one line, and the rows agree with the winner.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
import pytest

from services.conductor.registration import ComputeRegistry
from services.conductor.rpcapi import RegisterCompute, Registration
from shared.config import DatabaseSettings
from shared.db import compute_nodes, service_maintenance
from shared.db.pool import create_pool
from shared.exceptions import (
    Conflict,
    DuplicateComputeNode,
    HostRenameDetected,
    KeelError,
    ServiceNotFound,
)
from shared.version_pins import MinimumVersions
from shared.versions import SERVICE_VERSION
from tests.faults.proxy import TcpProxy, url_through
from tests.functional.services.conductor.stand_in import resources

pytestmark = pytest.mark.functional

T = TypeVar("T")
DOWN_TIME = 60.0
SOON = 20.0


@pytest.fixture
def registry(db_pool: asyncpg.Pool) -> ComputeRegistry:
    return ComputeRegistry(
        db_pool, service_down_time=DOWN_TIME, minimums=MinimumVersions(db_pool, ttl=60)
    )


def request(host: str, node_uuid: UUID, hypervisor: str | None = None) -> RegisterCompute:
    return RegisterCompute(
        host=host,
        node_uuid=node_uuid,
        version=SERVICE_VERSION,
        resources=resources(hypervisor or host),
    )


async def stopped_long_ago(pool: asyncpg.Pool, host: str) -> None:
    """The host's agent registered and heartbeated an hour ago, then stopped."""
    async with pool.acquire() as conn:
        await conn.execute(
            """UPDATE services SET registered_at = now() - interval '1 hour',
                                   last_seen_up = now() - interval '1 hour'
                WHERE host = $1""",
            host,
        )


async def rows_of(pool: asyncpg.Pool, *hosts: str) -> dict[str, list[Any]]:
    """The live compute services and nodes of ``hosts``: (service host, node uuid) pairs."""
    async with pool.acquire() as conn:
        found = await conn.fetch(
            """SELECT s.host, n.uuid AS node, n.host AS node_host
                 FROM services s LEFT JOIN compute_nodes n
                      ON n.service_id = s.id AND n.deleted_at IS NULL
                WHERE s.deleted_at IS NULL AND s.host = ANY($1::text[])
                ORDER BY s.host, n.id""",
            list(hosts),
        )
    result: dict[str, list[Any]] = {}
    for row in found:
        result.setdefault(row["host"], []).append((row["node"], row["node_host"]))
    return result


async def waiting_on_locks(pool: asyncpg.Pool, count: int) -> None:
    """Until ``count`` backends of this database wait for a lock."""
    async with asyncio.timeout(SOON):
        while True:
            async with pool.acquire() as conn:
                waiting = await conn.fetchval(
                    """SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'"""
                )
            if waiting >= count:
                return
            await asyncio.sleep(0.02)


async def outcome(call: Awaitable[T]) -> T | KeelError:
    try:
        return await call
    except KeelError as exc:
        return exc


# -- two agents with one KEEL_HOST ----------------------------------------------------


async def test_two_agents_of_one_host_forced_to_overlap_one_wins(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    """Both have resolved their host as new before either writes its node: the table of
    nodes is locked until both are seen waiting."""
    first, second = uuid.uuid4(), uuid.uuid4()
    async with db_pool.acquire() as locker:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute("LOCK TABLE compute_nodes IN EXCLUSIVE MODE")
        racing = [
            asyncio.create_task(outcome(registry.register(request("twin", first, "hv-a")))),
            asyncio.create_task(outcome(registry.register(request("twin", second, "hv-b")))),
        ]
        await waiting_on_locks(db_pool, 2)
        await transaction.rollback()
    results = await asyncio.gather(*racing)

    won = [r for r in results if isinstance(r, Registration)]
    lost = [r for r in results if isinstance(r, DuplicateComputeNode)]
    assert (len(won), len(lost)) == (1, 1), results
    assert "duplicate compute node: host 'twin' already has compute node" in lost[0].message
    assert "If another agent runs with KEEL_HOST=twin" in lost[0].message
    assert await rows_of(db_pool, "twin") == {"twin": [(won[0].node_uuid, "twin")]}


async def test_pairs_of_agents_registering_at_once_each_have_one_winner(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    hosts = [f"pair{n}" for n in range(8)]
    calls = [
        registry.register(request(host, uuid.uuid4(), f"{host}-{side}"))
        for host in hosts
        for side in ("a", "b")
    ]
    results = await asyncio.gather(*(outcome(call) for call in calls))

    rows = await rows_of(db_pool, *hosts)
    for n, host in enumerate(hosts):
        pair = results[2 * n : 2 * n + 2]
        won = [r for r in pair if isinstance(r, Registration)]
        assert len(won) == 1, pair
        assert [type(r) for r in pair if not isinstance(r, Registration)] == [DuplicateComputeNode]
        assert rows[host] == [(won[0].node_uuid, host)]


# -- an agent starting under the old name while its host is renamed -------------------


async def renamable(registry: ComputeRegistry, pool: asyncpg.Pool, host: str) -> Registration:
    """A compute host that registered, then stopped long ago."""
    registration = await registry.register(request(host, uuid.uuid4()))
    await stopped_long_ago(pool, host)
    return registration


async def rename(pool: asyncpg.Pool, old: str, new: str) -> service_maintenance.Renamed:
    async with pool.acquire() as conn:
        return await service_maintenance.rename_compute(conn, old, new, DOWN_TIME)


async def test_a_rename_committed_first_refuses_the_agent_under_the_old_name(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    first = await renamable(registry, db_pool, "old")
    async with db_pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        await service_maintenance.rename_compute(conn, "old", "new", DOWN_TIME)
        starting = asyncio.create_task(outcome(registry.register(request("old", first.node_uuid))))
        await waiting_on_locks(db_pool, 1)
        await transaction.commit()
    refused = await starting

    assert isinstance(refused, HostRenameDetected), refused
    assert refused.message.startswith("Possible rename detected")
    assert "belongs to host 'new'" in refused.message
    # No new row for the old name, and the node stays with its (renamed) service.
    assert await rows_of(db_pool, "old", "new") == {"new": [(first.node_uuid, "new")]}
    async with db_pool.acquire() as conn:
        node = await compute_nodes.get_by_uuid(conn, first.node_uuid)
    assert node.service_id == first.service_id


async def test_an_agent_registered_first_refuses_the_rename(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    first = await renamable(registry, db_pool, "old")
    again = await registry.register(request("old", first.node_uuid))
    assert again == first

    with pytest.raises(Conflict) as refused:
        await rename(db_pool, "old", "new")

    assert "registered 0s ago and may still be starting" in refused.value.message
    assert await rows_of(db_pool, "old", "new") == {"old": [(first.node_uuid, "old")]}


async def test_an_agent_registering_while_a_rename_waits_refuses_the_rename(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    """The registration holds the service row; the rename waits for it, then sees it."""
    first = await renamable(registry, db_pool, "old")
    async with db_pool.acquire() as locker:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute("LOCK TABLE compute_nodes IN EXCLUSIVE MODE")
        starting = asyncio.create_task(outcome(registry.register(request("old", first.node_uuid))))
        await waiting_on_locks(db_pool, 1)
        renaming = asyncio.create_task(outcome(rename(db_pool, "old", "new")))
        await waiting_on_locks(db_pool, 2)
        await transaction.rollback()
    registered, renamed = await asyncio.gather(starting, renaming)

    assert registered == first
    assert isinstance(renamed, Conflict), renamed
    assert await rows_of(db_pool, "old", "new") == {"old": [(first.node_uuid, "old")]}


async def test_renames_and_starts_at_once_each_have_one_winner(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    hosts = [f"race{n}" for n in range(6)]
    firsts = [await renamable(registry, db_pool, host) for host in hosts]
    calls: list[Awaitable[object]] = []
    for host, first in zip(hosts, firsts, strict=True):
        calls += [
            rename(db_pool, host, f"{host}-new"),
            registry.register(request(host, first.node_uuid)),
        ]
    results = await asyncio.gather(*(outcome(call) for call in calls))

    rows = await rows_of(db_pool, *hosts, *(f"{host}-new" for host in hosts))
    for n, (host, first) in enumerate(zip(hosts, firsts, strict=True)):
        renamed, registered = results[2 * n], results[2 * n + 1]
        if isinstance(renamed, service_maintenance.Renamed):
            assert isinstance(registered, HostRenameDetected), registered
            assert host not in rows
            assert rows[f"{host}-new"] == [(first.node_uuid, f"{host}-new")]
        else:
            assert isinstance(renamed, Conflict), renamed
            assert registered == first
            assert rows[host] == [(first.node_uuid, host)]
            assert f"{host}-new" not in rows


async def test_two_renames_at_once_one_wins(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    first = await renamable(registry, db_pool, "old")

    results = await asyncio.gather(
        outcome(rename(db_pool, "old", "new-a")), outcome(rename(db_pool, "old", "new-b"))
    )

    won = [r for r in results if isinstance(r, service_maintenance.Renamed)]
    lost = [r for r in results if isinstance(r, ServiceNotFound)]
    assert (len(won), len(lost)) == (1, 1), results
    assert "there is no compute service on host 'old'" in lost[0].message
    winner = won[0].service.host
    assert await rows_of(db_pool, "old", "new-a", "new-b") == {winner: [(first.node_uuid, winner)]}


# -- a node never changes service except by rename ------------------------------------


async def test_a_node_is_never_moved_to_another_service(
    registry: ComputeRegistry, db_pool: asyncpg.Pool
) -> None:
    first = await registry.register(request("owner", uuid.uuid4()))
    other = await registry.register(request("other", uuid.uuid4()))

    async with db_pool.acquire() as conn:
        with pytest.raises(HostRenameDetected) as refused:
            await compute_nodes.upsert(
                conn,
                node_uuid=first.node_uuid,
                service_id=other.service_id,
                host="other",
                resources=resources("owner"),
            )
        node = await compute_nodes.get_by_uuid(conn, first.node_uuid)
        # A node an older release left without its service link is linked, once.
        await conn.execute("UPDATE compute_nodes SET service_id = NULL WHERE id = $1", node.id)
        linked = await compute_nodes.upsert(
            conn,
            node_uuid=first.node_uuid,
            service_id=first.service_id,
            host="owner",
            resources=resources("owner"),
        )

    assert "a node changes service only by `keel-manage service rename`" in refused.value.message
    assert node.service_id == first.service_id
    assert linked.service_id == first.service_id


# -- a database call that fails once ---------------------------------------------------


@pytest.fixture
async def proxied_pool(database_url: str, pg_proxy: TcpProxy) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(
        url_through(database_url, pg_proxy.address), DatabaseSettings(connect_timeout=5)
    )
    yield pool
    await pool.close()


@pytest.mark.parametrize("cut_after", [b"INSERT INTO compute_nodes", b"COMMIT"])
async def test_a_registration_cut_off_once_is_whole_or_absent_and_can_be_repeated(
    proxied_pool: asyncpg.Pool, pg_proxy: TcpProxy, db_pool: asyncpg.Pool, cut_after: bytes
) -> None:
    registry = ComputeRegistry(
        proxied_pool, service_down_time=DOWN_TIME, minimums=MinimumVersions(db_pool, ttl=60)
    )
    node_uuid = uuid.uuid4()
    pg_proxy.cut_after(cut_after)

    with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError, KeelError)):
        await registry.register(request("flaky", node_uuid))

    rows = await rows_of(db_pool, "flaky")
    # Before the commit reached PostgreSQL nothing is left; after it, all of it.
    assert rows in ({}, {"flaky": [(node_uuid, "flaky")]})
    await pg_proxy.restore()
    again = await registry.register(request("flaky", node_uuid))
    assert await rows_of(db_pool, "flaky") == {"flaky": [(again.node_uuid, "flaky")]}


@pytest.mark.parametrize("cut_after", [b"UPDATE instances", b"COMMIT"])
async def test_a_rename_cut_off_once_is_whole_or_absent_and_can_be_repeated(
    registry: ComputeRegistry,
    db_pool: asyncpg.Pool,
    proxied_pool: asyncpg.Pool,
    pg_proxy: TcpProxy,
    cut_after: bytes,
) -> None:
    first = await renamable(registry, db_pool, "old")
    pg_proxy.cut_after(cut_after)

    with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError, KeelError)):
        await rename(proxied_pool, "old", "new")

    rows = await rows_of(db_pool, "old", "new")
    assert rows in (
        {"old": [(first.node_uuid, "old")]},
        {"new": [(first.node_uuid, "new")]},
    )
    await pg_proxy.restore()
    if "old" in rows:
        await rename(proxied_pool, "old", "new")
    else:
        with pytest.raises(ServiceNotFound):
            await rename(proxied_pool, "old", "new")
    assert await rows_of(db_pool, "old", "new") == {"new": [(first.node_uuid, "new")]}
