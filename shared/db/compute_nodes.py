"""Queries on ``compute_nodes``: agent reports, and host state for the scheduler.

A node belongs to its service by ``service_id``; ``host`` repeats the service's host
name for display. A deleted node (its service removed by an operator) keeps its row, and
its UUID is never brought back to life: :func:`upsert` refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from asyncpg import Record

from shared.db import services
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeDeleted, ComputeNodeNotFound, HostRenameDetected
from shared.objects.compute_node import ComputeNode, HostState, NodeResources, NodeTotals
from shared.objects.instance import Instance
from shared.objects.service import Service


async def upsert(
    conn: Connection,
    *,
    node_uuid: UUID,
    service_id: int,
    host: str,
    resources: NodeResources,
) -> ComputeNode:
    """Create the node an agent reports, or refresh it (never its usage).

    The report's hypervisor host name replaces the recorded one (a single-host driver
    may see its system host name change). Usage columns belong to the claims in
    ``allocations``; an agent report does not touch them. A node that was deleted is
    not revived: :class:`ComputeNodeDeleted`.

    The node's zone is its host aggregate's (``availability_zone`` metadata), else the
    one its agent reports; the reported one is kept for when the host leaves it.

    A node never changes service here (a compare-and-swap on ``service_id``): only
    ``keel-manage service rename`` moves a host, and it keeps the service. A node of
    another service is refused (:class:`HostRenameDetected`); a node an older release
    left without its service link is linked.
    """
    row = await conn.fetchrow(
        """INSERT INTO compute_nodes
               (uuid, service_id, host, hypervisor_hostname, hypervisor_type,
                availability_zone, vcpus, memory_mb, local_gb, running_vms,
                cpu_allocation_ratio, ram_allocation_ratio, disk_allocation_ratio,
                reported_availability_zone)
           VALUES ($1, $2, $3, $4, $5, COALESCE(keel_aggregate_zone($2), $6), $7, $8, $9,
                   $10, $11, $12, $13, $6)
           ON CONFLICT (uuid) DO UPDATE SET
               service_id = COALESCE(compute_nodes.service_id, EXCLUDED.service_id),
               hypervisor_hostname = EXCLUDED.hypervisor_hostname,
               hypervisor_type = EXCLUDED.hypervisor_type,
               availability_zone = EXCLUDED.availability_zone,
               reported_availability_zone = EXCLUDED.reported_availability_zone,
               vcpus = EXCLUDED.vcpus, memory_mb = EXCLUDED.memory_mb,
               local_gb = EXCLUDED.local_gb, running_vms = EXCLUDED.running_vms,
               cpu_allocation_ratio = EXCLUDED.cpu_allocation_ratio,
               ram_allocation_ratio = EXCLUDED.ram_allocation_ratio,
               disk_allocation_ratio = EXCLUDED.disk_allocation_ratio,
               updated_at = now()
             WHERE compute_nodes.deleted_at IS NULL
               AND (compute_nodes.service_id IS NULL
                    OR compute_nodes.service_id = EXCLUDED.service_id)
           RETURNING *""",
        node_uuid,
        service_id,
        host,
        resources.hypervisor_hostname,
        resources.hypervisor_type,
        resources.availability_zone,
        resources.vcpus,
        resources.memory_mb,
        resources.local_gb,
        resources.running_vms,
        resources.cpu_allocation_ratio,
        resources.ram_allocation_ratio,
        resources.disk_allocation_ratio,
    )
    if row is None:
        raise await _not_upserted(conn, node_uuid, service_id)
    return ComputeNode.from_row(row)


async def _not_upserted(conn: Connection, node_uuid: UUID, service_id: int) -> Exception:
    """Why :func:`upsert` changed nothing: the node was deleted, or is another service's."""
    row = await conn.fetchrow(
        """SELECT n.deleted_at, n.service_id, s.uuid AS service_uuid, s.host
             FROM compute_nodes n LEFT JOIN services s ON s.id = n.service_id
            WHERE n.uuid = $1""",
        node_uuid,
    )
    if row is None or row["deleted_at"] is not None:
        return ComputeNodeDeleted(
            f"compute node {node_uuid} was deleted; its UUID cannot be used again. Remove "
            "the agent's node identity file to start this host as a new compute node"
        )
    return HostRenameDetected(
        f"compute node {node_uuid} belongs to compute service {row['service_uuid']} (host "
        f"{row['host']!r}), not to service id {service_id}: a node changes service only by "
        "`keel-manage service rename`. Nothing was changed."
    )


async def find_by_uuid(conn: Connection, node_uuid: UUID) -> ComputeNode | None:
    """The node with this UUID, deleted or not; ``None`` if there never was one."""
    row = await conn.fetchrow("SELECT * FROM compute_nodes WHERE uuid = $1", node_uuid)
    return None if row is None else ComputeNode.from_row(row)


async def get_by_id(conn: Connection, node_id: int) -> ComputeNode:
    row = await conn.fetchrow(
        "SELECT * FROM compute_nodes WHERE id = $1 AND deleted_at IS NULL", node_id
    )
    if row is None:
        raise ComputeNodeNotFound(f"compute node {node_id} not found")
    return ComputeNode.from_row(row)


async def of_service(conn: Connection, service_id: int) -> list[ComputeNode]:
    """The live nodes of a service, oldest first."""
    rows = await conn.fetch(
        """SELECT * FROM compute_nodes
            WHERE service_id = $1 AND deleted_at IS NULL ORDER BY id""",
        service_id,
    )
    return [ComputeNode.from_row(row) for row in rows]


async def named(conn: Connection, *, host: str | None, node: str | None) -> list[ComputeNode]:
    """The live compute nodes of the live service on ``host`` and/or with hypervisor host
    name ``node`` (at least one is given), oldest first: how an admin's requested
    destination, given by name, becomes node ids once."""
    if host is None and node is None:
        raise ValueError("a host or a node name is needed")
    rows = await conn.fetch(
        """SELECT n.* FROM compute_nodes n JOIN services s ON s.id = n.service_id
            WHERE n.deleted_at IS NULL AND s.deleted_at IS NULL AND s."binary" = 'keel-compute'
              AND ($1::text IS NULL OR s.host = $1)
              AND ($2::text IS NULL OR n.hypervisor_hostname = $2)
            ORDER BY n.id""",
        host,
        node,
    )
    return [ComputeNode.from_row(row) for row in rows]


async def uuids_elsewhere(conn: Connection, service_id: int) -> list[UUID]:
    """The live nodes of every compute service but ``service_id``."""
    rows = await conn.fetch(
        """SELECT uuid FROM compute_nodes
            WHERE service_id IS DISTINCT FROM $1 AND deleted_at IS NULL""",
        service_id,
    )
    return [row["uuid"] for row in rows]


async def get_by_uuid(conn: Connection, node_uuid: UUID) -> ComputeNode:
    row = await conn.fetchrow(
        "SELECT * FROM compute_nodes WHERE uuid = $1 AND deleted_at IS NULL", node_uuid
    )
    if row is None:
        raise ComputeNodeNotFound(f"compute node {node_uuid} not found")
    return ComputeNode.from_row(row)


@dataclass(frozen=True)
class NodeRef:
    """A live compute node as a check needs it: its id and its service's."""

    id: int
    service_id: int | None


async def with_instance(
    conn: Connection, node_uuid: UUID, instance_uuid: UUID
) -> tuple[NodeRef, Instance | None]:
    """The live node ``node_uuid`` and the instance (deleted or not; ``None`` if it never
    existed), in one round trip. :class:`ComputeNodeNotFound` if there is no such node."""
    row = await conn.fetchrow(
        """SELECT i.*, n.id AS keel_node_id, n.service_id AS keel_node_service_id
             FROM compute_nodes n LEFT JOIN instances i ON i.uuid = $2
            WHERE n.uuid = $1 AND n.deleted_at IS NULL""",
        node_uuid,
        instance_uuid,
    )
    if row is None:
        raise ComputeNodeNotFound(f"compute node {node_uuid} not found")
    node = NodeRef(id=row["keel_node_id"], service_id=row["keel_node_service_id"])
    return node, None if row["uuid"] is None else Instance.from_row(row)


_HOST_STATES = f"""
    WITH s AS ({services.SELECT} WHERE s.deleted_at IS NULL)
    SELECT to_jsonb(n.*) AS node, to_jsonb(s.*) AS service
      FROM compute_nodes n JOIN s ON s.id = n.service_id
     WHERE n.deleted_at IS NULL
"""


async def host_states(conn: Connection, down_time: float) -> list[HostState]:
    """Every live node with its service, in one query (the scheduler's view of the cloud)."""
    rows = await conn.fetch(_HOST_STATES + " ORDER BY n.id", down_time)
    return _states(rows)


async def host_state(conn: Connection, node_uuid: UUID, down_time: float) -> HostState:
    row = await conn.fetchrow(_HOST_STATES + " AND n.uuid = $2", down_time, node_uuid)
    if row is None:
        raise ComputeNodeNotFound(f"compute node {node_uuid} not found")
    return HostState(
        node=ComputeNode.from_row(row["node"]), service=Service.from_row(row["service"])
    )


async def host_state_by_id(conn: Connection, node_id: int, down_time: float) -> HostState:
    row = await conn.fetchrow(_HOST_STATES + " AND n.id = $2", down_time, node_id)
    if row is None:
        raise ComputeNodeNotFound(f"compute node {node_id} not found")
    return HostState(
        node=ComputeNode.from_row(row["node"]), service=Service.from_row(row["service"])
    )


def _states(rows: list[Record]) -> list[HostState]:
    return [
        HostState(node=ComputeNode.from_row(r["node"]), service=Service.from_row(r["service"]))
        for r in rows
    ]


async def host_states_page(
    conn: Connection,
    down_time: float,
    *,
    after_id: int | None = None,
    limit: int,
    pattern: str | None = None,
) -> list[HostState]:
    """Up to ``limit`` live nodes with their services, by id, after node ``after_id``.

    ``pattern`` keeps only nodes whose hypervisor host name contains it.
    """
    rows = await conn.fetch(
        _HOST_STATES
        + """ AND ($2::bigint IS NULL OR n.id > $2)
              AND ($3::text IS NULL OR strpos(n.hypervisor_hostname, $3) > 0)
            ORDER BY n.id LIMIT $4""",
        down_time,
        after_id,
        pattern,
        limit,
    )
    return _states(rows)


async def host_states_matching(conn: Connection, down_time: float, pattern: str) -> list[HostState]:
    """Live nodes whose hypervisor host name contains ``pattern``, by id."""
    rows = await conn.fetch(
        _HOST_STATES + " AND strpos(n.hypervisor_hostname, $2) > 0 ORDER BY n.id",
        down_time,
        pattern,
    )
    return _states(rows)


async def host_states_on(
    conn: Connection, down_time: float, hosts: Sequence[str]
) -> list[HostState]:
    """The live nodes of the given compute hosts, with their services."""
    if not hosts:
        return []
    rows = await conn.fetch(
        _HOST_STATES + " AND n.host = ANY($2::text[]) ORDER BY n.id", down_time, list(hosts)
    )
    return _states(rows)


async def live_id(
    conn: Connection, *, node_id: int | None = None, node_uuid: UUID | None = None
) -> int | None:
    """The id of a live node named by id or UUID, or ``None`` if there is none."""
    value: int | None = await conn.fetchval(
        """SELECT id FROM compute_nodes
            WHERE deleted_at IS NULL AND ($1::bigint IS NULL OR id = $1)
              AND ($2::uuid IS NULL OR uuid = $2)
              AND ($1::bigint IS NOT NULL OR $2::uuid IS NOT NULL)""",
        node_id,
        node_uuid,
    )
    return value


async def enabled_totals(conn: Connection) -> NodeTotals:
    row = await conn.fetchrow(
        """SELECT count(*) AS count,
                  coalesce(sum(n.vcpus), 0)::bigint AS vcpus,
                  coalesce(sum(n.memory_mb), 0)::bigint AS memory_mb,
                  coalesce(sum(n.local_gb), 0)::bigint AS local_gb,
                  coalesce(sum(n.vcpus_used), 0)::bigint AS vcpus_used,
                  coalesce(sum(n.memory_mb_used), 0)::bigint AS memory_mb_used,
                  coalesce(sum(n.local_gb_used), 0)::bigint AS local_gb_used,
                  coalesce(sum(n.running_vms), 0)::bigint AS running_vms
             FROM compute_nodes n JOIN services s ON s.id = n.service_id
            WHERE n.deleted_at IS NULL AND s.deleted_at IS NULL AND NOT s.disabled"""
    )
    assert row is not None
    return NodeTotals.from_row(row)


async def availability_zones(conn: Connection) -> set[str]:
    """The availability zones of live nodes whose compute service is enabled."""
    rows = await conn.fetch(
        """SELECT DISTINCT n.availability_zone
             FROM compute_nodes n JOIN services s ON s.id = n.service_id
            WHERE n.deleted_at IS NULL AND s.deleted_at IS NULL AND NOT s.disabled"""
    )
    return {row["availability_zone"] for row in rows}
