"""Resource claims: atomic in PostgreSQL, so concurrent schedulers never over-commit.

A claim is held by a *consumer* on one compute node: the instance itself, or a migration
during a move (so a move holds its source and its destination at once). Every claim also
names the instance it serves. A claim is one conditional ``UPDATE`` of the node's usage
(which takes the row lock and re-checks capacity against the committed state) plus an
``allocations`` row, in one transaction. Two schedulers racing for the last slot on a
node cannot both win: the second ``UPDATE`` sees the first's usage and matches no row.

A node's ``*_used`` columns always equal the sum of its allocations: every change to one
is made with the other in the same transaction. :func:`usage_drift` checks it; a release
that finds less usage than it gives back logs the drift as an error instead of hiding it.
"""

from __future__ import annotations

import logging
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from shared.db.pool import Connection
from shared.objects.flavor import FlavorSnapshot
from shared.objects.instance import Allocation

LOG = logging.getLogger(__name__)


async def claim(
    conn: Connection,
    node_id: int,
    consumer_uuid: UUID,
    flavor: FlavorSnapshot,
    *,
    instance_uuid: UUID | None = None,
    force: bool = False,
) -> bool:
    """Claim ``flavor``'s resources on node ``node_id`` for the consumer; False if no room.

    ``instance_uuid`` defaults to the consumer (an instance claiming for itself).
    ``force`` records a claim whatever room is left: for a guest that already runs there
    (usage must say so, even beyond capacity; the scheduler then avoids the node).
    Idempotent: a consumer that already holds a claim on the node keeps it, and a
    concurrent twin of the same claim waits for the first and then finds it held.
    """
    if conn.is_in_transaction():
        return await _claim(
            conn, node_id, consumer_uuid, flavor, instance_uuid=instance_uuid, force=force
        )
    async with conn.transaction():
        return await _claim(
            conn, node_id, consumer_uuid, flavor, instance_uuid=instance_uuid, force=force
        )


async def _claim(
    conn: Connection,
    node_id: int,
    consumer_uuid: UUID,
    flavor: FlavorSnapshot,
    *,
    instance_uuid: UUID | None,
    force: bool,
) -> bool:
    """The claim in one statement — the allocation inserted unless held already, the
    node's usage added only for a new one and only if it has room — and, when it had
    none, the new allocation deleted again (both inside the caller's transaction)."""
    row = await conn.fetchrow(
        """WITH held AS (
               INSERT INTO allocations
                      (consumer_uuid, instance_uuid, compute_node_id, vcpus, memory_mb, local_gb)
               VALUES ($1, $2, $3, $4, $5, $6)
               ON CONFLICT (consumer_uuid, compute_node_id) DO NOTHING
               RETURNING id
           ), used AS (
               UPDATE compute_nodes
                  SET vcpus_used = vcpus_used + $4,
                      memory_mb_used = memory_mb_used + $5,
                      local_gb_used = local_gb_used + $6
                WHERE id = $3 AND deleted_at IS NULL AND EXISTS (SELECT 1 FROM held)
                  AND ($7 OR (vcpus_used + $4 <= vcpus * cpu_allocation_ratio
                              AND memory_mb_used + $5 <= memory_mb * ram_allocation_ratio
                              AND local_gb_used + $6 <= local_gb * disk_allocation_ratio))
               RETURNING id
           )
           SELECT (SELECT id FROM held) AS held, (SELECT id FROM used) AS used""",
        consumer_uuid,
        instance_uuid or consumer_uuid,
        node_id,
        flavor.vcpus,
        flavor.memory_mb,
        flavor.disk_gb,
        force,
    )
    assert row is not None
    if row["held"] is None:
        return True  # the consumer already holds this claim
    if row["used"] is None:
        await conn.execute("DELETE FROM allocations WHERE id = $1", row["held"])
        return False
    return True


async def _give_back(conn: Connection, allocation: Allocation) -> None:
    """Subtract a deleted allocation from its node's usage; log drift, never go negative."""
    node = await conn.fetchrow(
        """SELECT vcpus_used, memory_mb_used, local_gb_used FROM compute_nodes
            WHERE id = $1 FOR UPDATE""",
        allocation.compute_node_id,
    )
    if node is None:
        return
    if (
        node["vcpus_used"] < allocation.vcpus
        or node["memory_mb_used"] < allocation.memory_mb
        or node["local_gb_used"] < allocation.local_gb
    ):
        LOG.error(
            "accounting drift on compute node %d: releasing %d vCPUs, %d MB, %d GB for "
            "consumer %s, but the node records only %d vCPUs, %d MB, %d GB in use; "
            "usage no longer equals the sum of allocations",
            allocation.compute_node_id,
            allocation.vcpus,
            allocation.memory_mb,
            allocation.local_gb,
            allocation.consumer_uuid,
            node["vcpus_used"],
            node["memory_mb_used"],
            node["local_gb_used"],
            extra={"instance_uuid": str(allocation.instance_uuid), "decision": "usage_drift"},
        )
    await conn.execute(
        """UPDATE compute_nodes
              SET vcpus_used = greatest(vcpus_used - $2, 0),
                  memory_mb_used = greatest(memory_mb_used - $3, 0),
                  local_gb_used = greatest(local_gb_used - $4, 0)
            WHERE id = $1""",
        allocation.compute_node_id,
        allocation.vcpus,
        allocation.memory_mb,
        allocation.local_gb,
    )


async def _release_where(conn: Connection, where: str, *args: object) -> list[Allocation]:
    async with conn.transaction():
        rows = await conn.fetch(
            f"DELETE FROM allocations WHERE {where} RETURNING *",
            *args,
        )
        released = [Allocation.from_row(row) for row in rows]
        for allocation in sorted(released, key=lambda a: a.compute_node_id):
            await _give_back(conn, allocation)
    return released


async def release_where(conn: Connection, where: str, *args: object) -> list[Allocation]:
    """Give back the claims matching an SQL condition on ``allocations`` (with ``args``);
    for a check made in the same statement as the delete (a compare-and-swap)."""
    return await _release_where(conn, where, *args)


async def release(conn: Connection, consumer_uuid: UUID, node_id: int) -> Allocation | None:
    """Give back what the consumer holds on one node; ``None`` if nothing (idempotent)."""
    released = await _release_where(
        conn, "consumer_uuid = $1 AND compute_node_id = $2", consumer_uuid, node_id
    )
    return released[0] if released else None


async def release_consumer(conn: Connection, consumer_uuid: UUID) -> list[Allocation]:
    """Give back every claim of one consumer, on whichever nodes (idempotent)."""
    return await _release_where(conn, "consumer_uuid = $1", consumer_uuid)


async def release_instance(conn: Connection, instance_uuid: UUID) -> list[Allocation]:
    """Give back every claim serving the instance, its own and its moves' (idempotent)."""
    return await _release_where(conn, "instance_uuid = $1", instance_uuid)


async def hand_over(
    conn: Connection, node_id: int, *, from_consumer: UUID, to_consumer: UUID
) -> bool:
    """Give the claim ``from_consumer`` holds on one node to ``to_consumer``.

    Usage does not change: the same resources, another holder (a move's claim on its
    destination becomes the instance's own). False if there was nothing to hand over
    (already handed, or released). If ``to_consumer`` already holds a claim there, the
    two stay separate claims of the same instance.
    """
    status = await conn.execute(
        """UPDATE allocations SET consumer_uuid = $3
            WHERE consumer_uuid = $1 AND compute_node_id = $2
              AND NOT EXISTS (SELECT 1 FROM allocations
                               WHERE consumer_uuid = $3 AND compute_node_id = $2)""",
        from_consumer,
        node_id,
        to_consumer,
    )
    return status != "UPDATE 0"


async def held_on_node(conn: Connection, consumer_uuid: UUID, node_id: int | None) -> bool:
    """Whether the consumer holds a claim on node ``node_id`` (a server on its node: its
    build succeeded there, or a move left its claim there)."""
    return bool(
        await conn.fetchval(
            """SELECT EXISTS (SELECT 1 FROM allocations
                               WHERE consumer_uuid = $1 AND compute_node_id = $2)""",
            consumer_uuid,
            node_id,
        )
    )


async def for_instance(conn: Connection, instance_uuid: UUID) -> list[Allocation]:
    rows = await conn.fetch(
        "SELECT * FROM allocations WHERE instance_uuid = $1 ORDER BY id", instance_uuid
    )
    return [Allocation.from_row(row) for row in rows]


async def for_consumer(conn: Connection, consumer_uuid: UUID) -> list[Allocation]:
    rows = await conn.fetch(
        "SELECT * FROM allocations WHERE consumer_uuid = $1 ORDER BY id", consumer_uuid
    )
    return [Allocation.from_row(row) for row in rows]


class UsageDrift(BaseModel):
    """A node whose recorded usage differs from the sum of its allocations."""

    model_config = ConfigDict(frozen=True)

    node_id: int
    vcpus_used: int
    vcpus_allocated: int
    memory_mb_used: int
    memory_mb_allocated: int
    local_gb_used: int
    local_gb_allocated: int


async def usage_drift(conn: Connection) -> list[UsageDrift]:
    """Every node whose usage is not the sum of its allocations (empty when all is well)."""
    rows = await conn.fetch(
        """SELECT n.id AS node_id,
                  n.vcpus_used, coalesce(sum(a.vcpus), 0)::int AS vcpus_allocated,
                  n.memory_mb_used, coalesce(sum(a.memory_mb), 0)::int AS memory_mb_allocated,
                  n.local_gb_used, coalesce(sum(a.local_gb), 0)::int AS local_gb_allocated
             FROM compute_nodes n LEFT JOIN allocations a ON a.compute_node_id = n.id
            GROUP BY n.id
           HAVING n.vcpus_used <> coalesce(sum(a.vcpus), 0)
               OR n.memory_mb_used <> coalesce(sum(a.memory_mb), 0)
               OR n.local_gb_used <> coalesce(sum(a.local_gb), 0)
            ORDER BY n.id"""
    )
    return [UsageDrift.model_validate(dict(row)) for row in rows]
