"""Networks and subnets projects create through the Networking API.

A project network is a row of ``networks`` with its ``project_id`` (the configured
network has none). keel gives a network at most one IPv4 subnet, kept on the same row;
creating it fills the network's address pool in ``fixed_ips`` exactly as the configured
network's is filled, so allocation, release and the one-server-per-address guarantee
are the same (:mod:`shared.db.fixed_ips`).

Locks: an allocation takes the network's row ``FOR KEY SHARE`` (several creates at once
do not wait for one another); deleting the network or its subnet takes it ``FOR
UPDATE``, so a delete and an allocation never interleave: the delete sees the address
and answers "in use", or the allocation finds no network (or no subnet) and is refused.
"""

from __future__ import annotations

import ipaddress
import logging
from datetime import datetime
from uuid import UUID, uuid4

from shared.db import fixed_ips
from shared.db.pool import Connection
from shared.exceptions import Conflict, InvalidFixedIp, KeelError, NoMoreFixedIps
from shared.objects.base import KeelModel
from shared.objects.network import FixedIp, mac_address

LOG = logging.getLogger(__name__)

#: The largest subnet a project may create: every address is a row of ``fixed_ips``.
SUBNET_MIN_PREFIX = 16
#: The smallest: a /30 has two host addresses, the gateway and one for a server.
SUBNET_MAX_PREFIX = 30


class NetworkInUse(Conflict):
    """A server holds an address of the network (or subnet): it cannot be deleted."""


class NetworkRequiresSubnet(KeelError):
    """A server asked for a network that has no subnet to give it an address from."""


class SubnetRefused(KeelError):
    """A subnet keel cannot create (a second one on a network, say)."""


class ProjectNetwork(KeelModel):
    """A network a project created, with its subnet once it has one."""

    id: UUID
    name: str
    project_id: str
    created_at: datetime
    updated_at: datetime | None = None
    subnet_id: UUID | None = None
    subnet_name: str | None = None
    cidr: str | None = None
    gateway_ip: str | None = None
    first_address: str | None = None
    last_address: str | None = None


_COLUMNS = """id, name, project_id, created_at, updated_at, subnet_id, subnet_name,
              cidr::text AS cidr, host(gateway_ip) AS gateway_ip,
              host(first_address) AS first_address, host(last_address) AS last_address"""


async def create_network(conn: Connection, project_id: str, name: str) -> ProjectNetwork:
    row = await conn.fetchrow(
        f"""INSERT INTO networks (id, name, project_id) VALUES ($1, $2, $3)
            RETURNING {_COLUMNS}""",
        uuid4(),
        name,
        project_id,
    )
    assert row is not None
    network = ProjectNetwork.from_row(row)
    LOG.info(
        "project %s created network %s (%s)",
        project_id,
        network.id,
        name,
        extra={"decision": "network_created"},
    )
    return network


async def list_networks(conn: Connection, project_id: str | None) -> list[ProjectNetwork]:
    """Every project network (``project_id`` ``None``), or one project's, oldest first."""
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM networks
             WHERE project_id IS NOT NULL AND ($1::text IS NULL OR project_id = $1)
             ORDER BY created_at, id""",
        project_id,
    )
    return [ProjectNetwork.from_row(row) for row in rows]


async def get_network(
    conn: Connection, network_id: UUID, *, lock: str | None = None
) -> ProjectNetwork | None:
    """The project network ``network_id`` (``None`` if there is none); ``lock``: a row lock
    such as ``"FOR UPDATE"`` taken on it."""
    suffix = f" {lock}" if lock in ("FOR UPDATE", "FOR KEY SHARE") else ""
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM networks WHERE id = $1 AND project_id IS NOT NULL{suffix}",
        network_id,
    )
    return None if row is None else ProjectNetwork.from_row(row)


async def network_of_subnet(conn: Connection, subnet_id: UUID) -> ProjectNetwork | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM networks WHERE subnet_id = $1 AND project_id IS NOT NULL",
        subnet_id,
    )
    return None if row is None else ProjectNetwork.from_row(row)


async def _held(conn: Connection, network_id: UUID) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM fixed_ips WHERE network_id = $1 AND instance_uuid IS NOT NULL",
        network_id,
    )
    return count


async def delete_network(conn: Connection, network_id: UUID) -> bool:
    """Delete the network and its subnet; ``False`` if there is none. Raises
    :class:`NetworkInUse` while a server holds one of its addresses. Call in a transaction."""
    network = await get_network(conn, network_id, lock="FOR UPDATE")
    if network is None:
        return False
    held = await _held(conn, network_id)
    if held:
        raise NetworkInUse(
            f"Unable to complete operation on network {network_id}. There are one or more "
            f"ports still in use on the network ({held} server address(es))."
        )
    await conn.execute("DELETE FROM fixed_ips WHERE network_id = $1", network_id)
    await conn.execute("DELETE FROM networks WHERE id = $1", network_id)
    LOG.info("deleted network %s", network_id, extra={"decision": "network_deleted"})
    return True


def subnet_range(
    cidr: ipaddress.IPv4Network,
    gateway: ipaddress.IPv4Address | None,
    pool: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | None,
) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """The first and last address servers get: the allocation pool if given, else every
    host address of the subnet but the gateway's when it is the first or the last."""
    if pool is not None:
        return pool
    first, last = cidr.network_address + 1, cidr.broadcast_address - 1
    if gateway == first:
        first += 1
    elif gateway == last:
        last -= 1
    return first, last


async def create_subnet(
    conn: Connection,
    network_id: UUID,
    *,
    name: str,
    cidr: ipaddress.IPv4Network,
    gateway: ipaddress.IPv4Address | None,
    first: ipaddress.IPv4Address,
    last: ipaddress.IPv4Address,
) -> ProjectNetwork:
    """Give the network its subnet and fill its pool (the gateway gets no row). Raises
    :class:`SubnetRefused` when it already has one. Call in a transaction."""
    network = await get_network(conn, network_id, lock="FOR UPDATE")
    if network is None:
        raise SubnetRefused(f"Network {network_id} could not be found.")
    if network.subnet_id is not None:
        raise SubnetRefused(
            f"Network {network_id} already has subnet {network.subnet_id}: keel gives a "
            "network one IPv4 subnet."
        )
    row = await conn.fetchrow(
        f"""UPDATE networks SET subnet_id = $2, subnet_name = $3, cidr = $4::cidr,
                   gateway_ip = $5::inet, first_address = $6::inet, last_address = $7::inet,
                   updated_at = now()
             WHERE id = $1 RETURNING {_COLUMNS}""",
        network_id,
        uuid4(),
        name,
        str(cidr),
        None if gateway is None else str(gateway),
        str(first),
        str(last),
    )
    assert row is not None
    await conn.execute(
        """INSERT INTO fixed_ips (network_id, address)
           SELECT $1, $2::inet + g FROM generate_series(0, $3::bigint) g
            WHERE $4::inet IS NULL OR $2::inet + g <> $4::inet""",
        network_id,
        str(first),
        int(last) - int(first),
        None if gateway is None else str(gateway),
    )
    updated = ProjectNetwork.from_row(row)
    LOG.info(
        "network %s got subnet %s (%s): addresses %s to %s",
        network_id,
        updated.subnet_id,
        cidr,
        first,
        last,
        extra={"decision": "subnet_created"},
    )
    return updated


async def delete_subnet(conn: Connection, subnet_id: UUID) -> bool:
    """Remove the subnet and its pool; ``False`` if there is none. Raises
    :class:`NetworkInUse` while a server holds one of its addresses. Call in a transaction."""
    found = await network_of_subnet(conn, subnet_id)
    if found is None:
        return False
    network = await get_network(conn, found.id, lock="FOR UPDATE")
    if network is None or network.subnet_id != subnet_id:
        return False
    held = await _held(conn, network.id)
    if held:
        raise NetworkInUse(
            f"Unable to complete operation on subnet {subnet_id}: one or more ports have an "
            f"IP allocation from this subnet ({held} server address(es))."
        )
    await conn.execute("DELETE FROM fixed_ips WHERE network_id = $1", network.id)
    await conn.execute(
        """UPDATE networks SET subnet_id = NULL, subnet_name = NULL, cidr = NULL,
                  gateway_ip = NULL, first_address = NULL, last_address = NULL,
                  updated_at = now()
            WHERE id = $1""",
        network.id,
    )
    LOG.info("deleted subnet %s", subnet_id, extra={"decision": "subnet_deleted"})
    return True


async def allocate(
    conn: Connection,
    network: ProjectNetwork,
    instance_uuid: UUID,
    *,
    address: str | None,
    tag: str | None,
    position: int,
) -> FixedIp:
    """An address of the project network for the server (``address`` if given).

    Raises :class:`InvalidFixedIp` for an address outside the subnet's range or held,
    :class:`NoMoreFixedIps` when every address is held or the network has no subnet.
    """
    locked = await get_network(conn, network.id, lock="FOR KEY SHARE")
    if locked is None:
        # Deleted since the caller found it: as if it had never been there.
        raise NetworkRequiresSubnet(f"Network {network.id} could not be found.")
    if locked.subnet_id is None or locked.cidr is None:
        raise NetworkRequiresSubnet(
            f"Network {network.id} requires a subnet in order to boot instances on."
        )
    if address is not None:
        wanted = ipaddress.IPv4Address(address)
        first = ipaddress.IPv4Address(locked.first_address or "0.0.0.0")
        last = ipaddress.IPv4Address(locked.last_address or "0.0.0.0")
        if not first <= wanted <= last or str(wanted) == locked.gateway_ip:
            raise InvalidFixedIp(
                f"Fixed IP address {wanted} is not available on network {locked.name} "
                f"({locked.cidr}): servers get addresses from {first} to {last}."
            )
        address = str(wanted)
    taken = await fixed_ips.take(conn, locked.id, instance_uuid, address, tag, position=position)
    if taken is None and address is not None:
        raise InvalidFixedIp(f"Fixed IP address {address} is already in use.")
    if taken is None:
        raise NoMoreFixedIps(
            f"No more IP addresses available on network {locked.name} ({locked.cidr}): "
            "every address is held by a server."
        )
    return FixedIp(
        network_id=locked.id,
        network_name=locked.name,
        address=taken,
        mac=mac_address(locked.id, taken),
        tag=tag,
        cidr=locked.cidr,
    )


async def owned_counts(conn: Connection, project_id: str) -> dict[str, int]:
    """How many networks, subnets and security groups the project has (its default group
    counted, as Neutron counts it), for its quota details."""
    row = await conn.fetchrow(
        """SELECT (SELECT count(*) FROM networks WHERE project_id = $1) AS network,
                  (SELECT count(subnet_id) FROM networks WHERE project_id = $1) AS subnet,
                  (SELECT count(*) FROM security_groups WHERE project_id = $1) AS groups""",
        project_id,
    )
    assert row is not None
    return {
        "network": row["network"],
        "subnet": row["subnet"],
        "security_group": row["groups"] + 1,
    }


async def rename(
    conn: Connection, network_id: UUID, *, name: str | None, subnet_name: str | None
) -> ProjectNetwork | None:
    """Set the network's name or its subnet's; ``None`` if there is no such network."""
    row = await conn.fetchrow(
        f"""UPDATE networks
               SET name = coalesce($2, name),
                   subnet_name = CASE WHEN subnet_id IS NULL THEN NULL
                                      ELSE coalesce($3, subnet_name) END,
                   updated_at = now()
             WHERE id = $1 AND project_id IS NOT NULL RETURNING {_COLUMNS}""",
        network_id,
        name,
        subnet_name,
    )
    return None if row is None else ProjectNetwork.from_row(row)
