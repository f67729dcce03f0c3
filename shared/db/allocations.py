"""Resource claims: atomic in PostgreSQL, so concurrent schedulers never over-commit.

A claim is one conditional ``UPDATE`` of the node's usage (which takes the row lock and
re-checks capacity against the committed state) plus an ``allocations`` row, in one
transaction. Two schedulers racing for the last slot on a node cannot both win: the
second ``UPDATE`` sees the first's usage and matches no row.
"""

from __future__ import annotations

from uuid import UUID

from shared.db.pool import Connection
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Allocation


async def claim(
    conn: Connection, node_id: int, instance_uuid: UUID, flavor: FlavorSnapshot
) -> bool:
    """Claim ``flavor``'s resources on node ``node_id``; False if they no longer fit.

    Idempotent: an instance that already holds a claim on the node keeps it.
    """
    disk = flavor.disk_gb
    async with conn.transaction():
        held = await conn.fetchval(
            "SELECT 1 FROM allocations WHERE instance_uuid = $1 AND compute_node_id = $2",
            instance_uuid,
            node_id,
        )
        if held:
            return True
        updated = await conn.fetchval(
            """UPDATE compute_nodes
                  SET vcpus_used = vcpus_used + $2,
                      memory_mb_used = memory_mb_used + $3,
                      local_gb_used = local_gb_used + $4
                WHERE id = $1 AND deleted_at IS NULL
                  AND vcpus_used + $2 <= vcpus * cpu_allocation_ratio
                  AND memory_mb_used + $3 <= memory_mb * ram_allocation_ratio
                  AND local_gb_used + $4 <= local_gb * disk_allocation_ratio
            RETURNING id""",
            node_id,
            flavor.vcpus,
            flavor.memory_mb,
            disk,
        )
        if updated is None:
            return False
        await conn.execute(
            """INSERT INTO allocations (instance_uuid, compute_node_id, vcpus, memory_mb, local_gb)
               VALUES ($1, $2, $3, $4, $5)""",
            instance_uuid,
            node_id,
            flavor.vcpus,
            flavor.memory_mb,
            disk,
        )
        return True


async def release(conn: Connection, instance_uuid: UUID) -> list[Allocation]:
    """Give back every claim the instance holds; returns what was released (idempotent)."""
    async with conn.transaction():
        rows = await conn.fetch(
            "DELETE FROM allocations WHERE instance_uuid = $1 RETURNING *", instance_uuid
        )
        for row in rows:
            await conn.execute(
                """UPDATE compute_nodes
                      SET vcpus_used = greatest(vcpus_used - $2, 0),
                          memory_mb_used = greatest(memory_mb_used - $3, 0),
                          local_gb_used = greatest(local_gb_used - $4, 0)
                    WHERE id = $1""",
                row["compute_node_id"],
                row["vcpus"],
                row["memory_mb"],
                row["local_gb"],
            )
    return [Allocation.from_row(row) for row in rows]


async def for_instance(conn: Connection, instance_uuid: UUID) -> list[Allocation]:
    rows = await conn.fetch("SELECT * FROM allocations WHERE instance_uuid = $1", instance_uuid)
    return [Allocation.from_row(row) for row in rows]
