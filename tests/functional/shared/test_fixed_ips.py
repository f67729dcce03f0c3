"""The fixed address pool against a real PostgreSQL: concurrent, exhaustible, returned."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from shared.config import DatabaseSettings, NetworkSettings
from shared.db import fixed_ips
from shared.db.pool import create_pool
from shared.exceptions import InvalidFixedIp, NoMoreFixedIps
from shared.objects.network import PoolUsage, mac_address

pytestmark = pytest.mark.functional


async def allocate(pool: asyncpg.Pool, network: NetworkSettings, address: str | None = None) -> str:
    async with pool.acquire() as conn:
        held = await fixed_ips.allocate(conn, network, uuid.uuid4(), address=address)
    return held.address


async def test_two_hundred_concurrent_servers_get_distinct_addresses_and_return_them(
    db_pool: asyncpg.Pool,
) -> None:
    network = NetworkSettings()  # private, 10.0.0.0/16
    async with db_pool.acquire() as conn:
        before = await fixed_ips.ensure_network(conn, network)
    assert (before.total, before.free) == (65533, 65533)
    servers = [uuid.uuid4() for _ in range(200)]

    async def allocate_for(server: uuid.UUID) -> str:
        async with db_pool.acquire() as conn:
            return (await fixed_ips.allocate(conn, network, server)).address

    addresses = await asyncio.gather(*(allocate_for(s) for s in servers))

    assert len(set(addresses)) == 200
    assert {a.rsplit(".", 2)[0] for a in addresses} == {"10.0"}
    assert not {"10.0.0.0", "10.0.0.1", "10.0.255.255"} & set(addresses)
    async with db_pool.acquire() as conn:
        assert (await fixed_ips.usage(conn, network.network_id)).free == 65533 - 200
        held = await fixed_ips.for_instances(conn, servers)
    assert sorted(h.address for hs in held.values() for h in hs) == sorted(addresses)

    async def release(server: uuid.UUID) -> list[str]:
        async with db_pool.acquire() as conn:
            return await fixed_ips.release(conn, server)

    released = await asyncio.gather(*(release(s) for s in servers))
    assert sorted(a for r in released for a in r) == sorted(addresses)
    async with db_pool.acquire() as conn:
        assert (await fixed_ips.usage(conn, network.network_id)).free == 65533


async def test_the_lowest_free_address_is_given_first_and_again_once_freed(
    db_pool: asyncpg.Pool,
) -> None:
    network = NetworkSettings(cidr="192.168.7.0/29")
    first, second = uuid.uuid4(), uuid.uuid4()
    async with db_pool.acquire() as conn:
        assert (await fixed_ips.allocate(conn, network, first)).address == "192.168.7.2"
        assert (await fixed_ips.allocate(conn, network, second)).address == "192.168.7.3"
        await fixed_ips.release(conn, first)
        assert (await fixed_ips.allocate(conn, network, uuid.uuid4())).address == "192.168.7.2"


async def test_an_exhausted_network_says_so(db_pool: asyncpg.Pool) -> None:
    network = NetworkSettings(cidr="192.168.7.0/30")  # one usable address: .2
    assert await allocate(db_pool, network) == "192.168.7.2"
    with pytest.raises(NoMoreFixedIps, match="No more IP addresses available on network private"):
        await allocate(db_pool, network)


async def test_a_requested_address_is_given_only_if_usable_and_free(db_pool: asyncpg.Pool) -> None:
    network = NetworkSettings(cidr="192.168.7.0/24")
    assert await allocate(db_pool, network, address="192.168.7.77") == "192.168.7.77"
    with pytest.raises(InvalidFixedIp, match="already in use"):
        await allocate(db_pool, network, address="192.168.7.77")
    for unusable in ("192.168.7.0", "192.168.7.1", "192.168.7.255", "10.1.1.1"):
        with pytest.raises(InvalidFixedIp, match="not available on network private"):
            await allocate(db_pool, network, address=unusable)
    with pytest.raises(InvalidFixedIp, match="not an IPv4 address"):
        await allocate(db_pool, network, address="fe80::1")


async def test_racing_for_one_requested_address_gives_it_once(db_pool: asyncpg.Pool) -> None:
    network = NetworkSettings(cidr="192.168.7.0/24")
    outcomes = await asyncio.gather(
        *(allocate(db_pool, network, address="192.168.7.9") for _ in range(8)),
        return_exceptions=True,
    )
    assert outcomes.count("192.168.7.9") == 1
    assert all(isinstance(o, InvalidFixedIp) for o in outcomes if o != "192.168.7.9")


async def test_release_is_idempotent_under_concurrent_twins(db_pool: asyncpg.Pool) -> None:
    network = NetworkSettings(cidr="192.168.7.0/29")
    server = uuid.uuid4()
    async with db_pool.acquire() as conn:
        address = (await fixed_ips.allocate(conn, network, server)).address

    async def release() -> list[str]:
        async with db_pool.acquire() as conn:
            return await fixed_ips.release(conn, server)

    results = await asyncio.gather(*(release() for _ in range(4)))
    assert sorted(results) == [[], [], [], [address]]
    async with db_pool.acquire() as conn:
        assert (await fixed_ips.usage(conn, network.network_id)).free == 5


async def test_a_changed_cidr_refills_the_pool_and_keeps_held_addresses_until_freed(
    db_pool: asyncpg.Pool,
) -> None:
    old = NetworkSettings(cidr="192.168.7.0/28")
    new = NetworkSettings(cidr="192.168.7.0/29")
    server = uuid.uuid4()
    async with db_pool.acquire() as conn:
        held = await fixed_ips.allocate(conn, old, server, address="192.168.7.12")
        assert held.mac == mac_address(old.network_id, "192.168.7.12")
        refilled = await fixed_ips.ensure_network(conn, new)
        assert (refilled.total, refilled.free) == (5, 5)
        assert [h.address for h in await fixed_ips.for_instance(conn, server)] == ["192.168.7.12"]
        assert await fixed_ips.release(conn, server) == ["192.168.7.12"]
        assert await conn.fetchval("SELECT count(*) FROM fixed_ips") == 5


async def test_a_pool_larger_than_one_fill_statement_holds_every_usable_address_once(
    db_pool: asyncpg.Pool,
) -> None:
    network = NetworkSettings(name="wide", cidr="10.64.0.0/14")  # 262,144 addresses
    async with db_pool.acquire() as conn:
        usage = await fixed_ips.ensure_network(conn, network)
        ends = await conn.fetchrow(
            """SELECT min(address)::text AS first, max(address)::text AS last,
                      count(DISTINCT address) AS distinct_addresses
                 FROM fixed_ips WHERE network_id = $1""",
            network.network_id,
        )
    assert usage.total > fixed_ips.FILL_BATCH * 3
    assert (usage.total, usage.free) == (262_141, 262_141)
    assert ends is not None
    assert (ends["first"], ends["last"]) == ("10.64.0.2/32", "10.67.255.254/32")
    assert ends["distinct_addresses"] == usage.total


async def test_a_pool_filled_by_another_process_for_longer_than_a_statement_may_last_is_waited_for(
    db_pool: asyncpg.Pool, database_url: str
) -> None:
    """A second keel-api starting while the first fills a large pool waits for the fill,
    however long it takes: here the lock is held for three times the command timeout."""
    network = NetworkSettings(name="slow-fill", cidr="10.64.0.0/24")
    short = await create_pool(database_url, DatabaseSettings(command_timeout=1.0))
    holder = await db_pool.acquire()
    try:
        filling = holder.transaction()
        await filling.start()
        await holder.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            fixed_ips._LOCK_CLASS,  # the lock the fill holds
            str(network.network_id),
        )

        async def second() -> PoolUsage:
            async with short.acquire() as conn:
                return await fixed_ips.ensure_network(conn, network)

        waiting = asyncio.create_task(second())
        await asyncio.sleep(3.0)
        assert not waiting.done()
        await filling.commit()
        usage = await asyncio.wait_for(waiting, timeout=10)
    finally:
        await db_pool.release(holder)
        await short.close()
    assert (usage.total, usage.free) == (253, 253)
