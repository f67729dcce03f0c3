"""Fixed IPv4 addresses: a pool per network, handed out atomically in PostgreSQL.

Every address a network can hand out is a row of ``fixed_ips`` (network, gateway and
broadcast addresses are never rows). A server holds an address when the row names it,
so the primary key alone means no two servers share an address.

* :func:`allocate` takes the lowest free row with ``FOR UPDATE SKIP LOCKED`` and names
  the server in it, in one statement: concurrent allocations each lock a different row
  and never wait for one another, and the cost does not grow with the pool's size.
* :func:`release` frees every address a server holds; it is idempotent, so each delete
  path may call it, and twins running at once free each row once.
* :func:`ensure_network` creates the network's row and its pool the first time (under
  an advisory lock, so two API processes starting at once fill it once), and refills it
  when the configured CIDR changes: new addresses are added, free ones outside the new
  range removed; held ones outside it stay until their server is deleted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable
from datetime import datetime
from uuid import UUID

from shared.config import NetworkSettings
from shared.db.pool import Connection
from shared.exceptions import InvalidFixedIp, NoMoreFixedIps
from shared.objects.base import KeelModel
from shared.objects.network import FixedIp, Network, PoolUsage, mac_address

LOG = logging.getLogger(__name__)

#: The first key of the advisory lock that serialises filling one network's pool.
_LOCK_CLASS = 0x6B6E6574  # "knet"

_ALLOCATE_LOWEST = """
    UPDATE fixed_ips SET instance_uuid = $2, tag = $3, position = $4, allocated_at = now()
     WHERE (network_id, address) = (
               SELECT network_id, address FROM fixed_ips
                WHERE network_id = $1 AND instance_uuid IS NULL
                ORDER BY address
                LIMIT 1
                  FOR UPDATE SKIP LOCKED)
    RETURNING host(address) AS address
"""

_ALLOCATE_ADDRESS = """
    UPDATE fixed_ips SET instance_uuid = $2, tag = $3, position = $4, allocated_at = now()
     WHERE network_id = $1 AND address = $5::inet AND instance_uuid IS NULL
    RETURNING host(address) AS address
"""

_RELEASE = """
    WITH held AS (
        SELECT f.network_id, f.address,
               f.address BETWEEN n.first_address AND n.last_address AS usable
          FROM fixed_ips f JOIN networks n ON n.id = f.network_id
         WHERE f.instance_uuid = $1
           FOR UPDATE OF f
    ), dropped AS (
        DELETE FROM fixed_ips f USING held h
         WHERE f.network_id = h.network_id AND f.address = h.address AND NOT h.usable
        RETURNING f.address
    ), freed AS (
        UPDATE fixed_ips f
           SET instance_uuid = NULL, tag = NULL, position = NULL, allocated_at = NULL
          FROM held h
         WHERE f.network_id = h.network_id AND f.address = h.address AND h.usable
        RETURNING f.address
    )
    SELECT host(address) AS address FROM dropped
    UNION ALL
    SELECT host(address) FROM freed
"""


def usable_range(settings: NetworkSettings) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """The first and last address a server may get: not network, gateway or broadcast."""
    network = settings.network
    return network.network_address + 2, network.broadcast_address - 1


def describe(settings: NetworkSettings) -> str:
    return f"network {settings.name} ({settings.cidr})"


async def _network_row(conn: Connection, network_id: UUID) -> Network | None:
    row = await conn.fetchrow(
        "SELECT id, name, cidr::text AS cidr FROM networks WHERE id = $1", network_id
    )
    return None if row is None else Network.from_row(row)


#: Addresses one statement of a pool's fill inserts: a /12 (a million addresses) in one
#: statement can outlast the command timeout on a busy database server.
FILL_BATCH = 65_536


async def _fill(conn: Connection, settings: NetworkSettings) -> None:
    first, last = usable_range(settings)
    network_id = settings.network_id
    for start in range(int(first), int(last) + 1, FILL_BATCH):
        count = min(FILL_BATCH, int(last) + 1 - start)
        await conn.execute(
            """INSERT INTO fixed_ips (network_id, address)
               SELECT $1, $2::inet + g FROM generate_series(0, $3::bigint) g
               ON CONFLICT DO NOTHING""",
            network_id,
            str(ipaddress.IPv4Address(start)),
            count - 1,
        )
    await conn.execute(
        """DELETE FROM fixed_ips
            WHERE network_id = $1 AND instance_uuid IS NULL
              AND NOT address BETWEEN $2::inet AND $3::inet""",
        network_id,
        str(first),
        str(last),
    )


#: Seconds between tries of a network's lock while another process holds it.
LOCK_RETRY = 0.5


async def _lock_network(conn: Connection, settings: NetworkSettings) -> None:
    """Take the network's lock until the transaction ends, however long another process
    holds it (filling a /12 takes minutes on a busy server): each try is a statement of
    its own, so no statement waits past the command timeout."""
    waiting = False
    while not await conn.fetchval(
        "SELECT pg_try_advisory_xact_lock($1, hashtext($2))",
        _LOCK_CLASS,
        str(settings.network_id),
    ):
        if not waiting:
            LOG.info(
                "another process is creating or filling the address pool of %s; waiting "
                "for it to finish",
                describe(settings),
            )
            waiting = True
        await asyncio.sleep(LOCK_RETRY)


async def ensure_network(conn: Connection, settings: NetworkSettings) -> PoolUsage:
    """Create or update the network and its pool to match ``settings``; its usage."""
    network_id = settings.network_id
    first, last = usable_range(settings)
    async with conn.transaction():
        await _lock_network(conn, settings)
        stored = await _network_row(conn, network_id)
        if stored is None or stored.name != settings.name or stored.cidr != settings.cidr:
            await conn.execute(
                """INSERT INTO networks (id, name, cidr, first_address, last_address)
                   VALUES ($1, $2, $3::cidr, $4::inet, $5::inet)
                   ON CONFLICT (id) DO UPDATE SET
                       name = EXCLUDED.name, cidr = EXCLUDED.cidr,
                       first_address = EXCLUDED.first_address,
                       last_address = EXCLUDED.last_address, updated_at = now()""",
                network_id,
                settings.name,
                settings.cidr,
                str(first),
                str(last),
            )
        if stored is None or stored.cidr != settings.cidr:
            await _fill(conn, settings)
            LOG.info(
                "filled the address pool of %s (id %s): %s to %s",
                describe(settings),
                network_id,
                first,
                last,
                extra={"decision": "network_filled"},
            )
    return await usage(conn, network_id)


async def usage(conn: Connection, network_id: UUID) -> PoolUsage:
    network = await _network_row(conn, network_id)
    if network is None:
        raise NoMoreFixedIps(f"Network {network_id} has no address pool yet.")
    row = await conn.fetchrow(
        """SELECT count(*) AS total, count(*) FILTER (WHERE f.instance_uuid IS NULL) AS free
             FROM fixed_ips f JOIN networks n ON n.id = f.network_id
            WHERE f.network_id = $1 AND f.address BETWEEN n.first_address AND n.last_address""",
        network_id,
    )
    assert row is not None
    return PoolUsage(network=network, total=row["total"], free=row["free"])


def _check_requested(settings: NetworkSettings, address: str) -> str:
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        raise InvalidFixedIp(
            f"Invalid fixed IP address {address!r}: not an IPv4 address."
        ) from None
    first, last = usable_range(settings)
    if not first <= wanted <= last:
        raise InvalidFixedIp(
            f"Fixed IP address {wanted} is not available on {describe(settings)}: servers "
            f"get addresses from {first} to {last}."
        )
    return str(wanted)


async def take(
    conn: Connection,
    network_id: UUID,
    instance_uuid: UUID,
    address: str | None,
    tag: str | None,
    *,
    position: int | None = None,
) -> str | None:
    """Name the server in one free row of the network: ``address``'s, or the lowest free
    one; the address taken, ``None`` when that row is held (or there is no free one)."""
    if address is None:
        taken: str | None = await conn.fetchval(
            _ALLOCATE_LOWEST, network_id, instance_uuid, tag, position
        )
    else:
        taken = await conn.fetchval(
            _ALLOCATE_ADDRESS, network_id, instance_uuid, tag, position, address
        )
    return taken


async def allocate(
    conn: Connection,
    settings: NetworkSettings,
    instance_uuid: UUID,
    *,
    address: str | None = None,
    tag: str | None = None,
    position: int | None = None,
) -> FixedIp:
    """Give the server an address of the network: ``address`` if given, else the lowest free.
    ``position``: where the create request asked for it, which the server's list keeps.

    Raises :class:`NoMoreFixedIps` when every address is taken and
    :class:`InvalidFixedIp` when ``address`` is outside the network or already held.
    """
    if address is not None:
        address = _check_requested(settings, address)
    network_id = settings.network_id
    taken = await take(conn, network_id, instance_uuid, address, tag, position=position)
    if taken is None:
        stored = await _network_row(conn, network_id)
        if stored is None or stored.cidr != settings.cidr:
            await ensure_network(conn, settings)
            taken = await take(conn, network_id, instance_uuid, address, tag, position=position)
    if taken is None and address is not None:
        raise InvalidFixedIp(f"Fixed IP address {address} is already in use.")
    if taken is None:
        raise NoMoreFixedIps(
            f"No more IP addresses available on {describe(settings)}: every address is "
            "held by a server. Delete servers you no longer need, or ask your operator for "
            "a larger network."
        )
    return FixedIp(
        network_id=settings.network_id,
        network_name=settings.name,
        address=taken,
        mac=mac_address(settings.network_id, taken),
        tag=tag,
    )


async def release(conn: Connection, instance_uuid: UUID) -> list[str]:
    """Free every address ``instance_uuid`` holds; the addresses freed (none if repeated)."""
    rows = await conn.fetch(_RELEASE, instance_uuid)
    return [row["address"] for row in rows]


async def for_instances(
    conn: Connection, instance_uuids: Iterable[UUID]
) -> dict[UUID, list[FixedIp]]:
    """The addresses each of ``instance_uuids`` holds (instances holding none are absent)."""
    rows = await conn.fetch(
        """SELECT f.instance_uuid, f.network_id, n.name AS network_name,
                  host(f.address) AS address, f.tag, n.cidr::text AS cidr
             FROM fixed_ips f JOIN networks n ON n.id = f.network_id
            WHERE f.instance_uuid = ANY($1::uuid[])
            ORDER BY coalesce(f.position, 0), n.name, f.address""",
        list(instance_uuids),
    )
    held: dict[UUID, list[FixedIp]] = {}
    for row in rows:
        held.setdefault(row["instance_uuid"], []).append(
            FixedIp(
                network_id=row["network_id"],
                network_name=row["network_name"],
                address=row["address"],
                mac=mac_address(row["network_id"], row["address"]),
                tag=row["tag"],
                cidr=row["cidr"],
            )
        )
    return held


async def for_instance(conn: Connection, instance_uuid: UUID) -> list[FixedIp]:
    return (await for_instances(conn, [instance_uuid])).get(instance_uuid, [])


class HeldAddress(KeelModel):
    """An address a live server holds, with what the Networking API shows of its port."""

    network_id: UUID
    #: The subnet's id for a network a project created; ``None`` for the configured one.
    subnet_id: UUID | None = None
    address: str
    instance_uuid: UUID
    project_id: str
    host: str | None
    allocated_at: datetime | None


async def held_addresses(conn: Connection, project_id: str | None) -> list[HeldAddress]:
    """The addresses live servers hold (of one project, or of all), in address order."""
    rows = await conn.fetch(
        """SELECT f.network_id, n.subnet_id, host(f.address) AS address, f.instance_uuid,
                  i.project_id, i.host, f.allocated_at
             FROM fixed_ips f JOIN instances i ON i.uuid = f.instance_uuid
             JOIN networks n ON n.id = f.network_id
            WHERE i.deleted_at IS NULL AND ($1::text IS NULL OR i.project_id = $1)
            ORDER BY f.network_id, f.address""",
        project_id,
    )
    return [HeldAddress.from_row(row) for row in rows]


async def count_for_project(conn: Connection, project_id: str) -> int:
    """How many addresses the project's live servers hold (its ports, to Neutron clients)."""
    count: int = await conn.fetchval(
        """SELECT count(*) FROM fixed_ips f JOIN instances i ON i.uuid = f.instance_uuid
            WHERE i.project_id = $1 AND i.deleted_at IS NULL""",
        project_id,
    )
    return count
