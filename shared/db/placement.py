"""Where an instance runs: Instance → ComputeNode (by id) → Service (by id).

Routing and ownership follow ``instances.compute_id``. Rows written by a release that
did not record it carry only the host and node names until ``keel-manage db
online-data-migrations`` links them. For those rows, and only for them, the node is
found by :func:`legacy_node_by_host_name` — the one place an instance is matched to its
node by host name — and each use is logged, so an operator sees that the migration is
due. A row that has a ``compute_id`` is never matched by name, even when its names and
the node's differ (after a rename, or a hypervisor host name change).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shared.db import compute_nodes, services
from shared.db.pool import Connection
from shared.exceptions import ComputeNodeNotFound, ServiceNotFound
from shared.objects.compute_node import ComputeNode, HostState
from shared.objects.instance import Instance

LOG = logging.getLogger(__name__)


def legacy_node_id_sql(alias: str) -> str:
    """SQL for the node id an unlinked instance ``alias`` runs on, matched by names.

    The live node of the instance's host whose hypervisor host name is the instance's
    node; otherwise NULL. A host's only node is not taken for a row naming another node:
    that would be a guess (the node may have been replaced, or the row may be stale).
    """
    return f"""(SELECT n.id FROM compute_nodes n
          WHERE n.deleted_at IS NULL AND n.host = {alias}.host
            AND n.hypervisor_hostname = {alias}.node)"""


def node_id_sql(alias: str) -> str:
    """SQL for the node id instance ``alias`` runs on: its link, else the legacy match."""
    return (
        f"COALESCE({alias}.compute_id, CASE WHEN {alias}.host IS NOT NULL "
        f"THEN {legacy_node_id_sql(alias)} END)"
    )


def _log_fallback(instance: Instance, node: ComputeNode | None) -> None:
    LOG.warning(
        "instance %s has no compute node id (written by an older release): %s by its host "
        "name %r; run `keel-manage db online-data-migrations` to link such rows",
        instance.uuid,
        f"found node {node.uuid} ({node.hypervisor_hostname})" if node else "no node found",
        instance.host,
        extra={"instance_uuid": str(instance.uuid), "decision": "host_name_fallback"},
    )


async def legacy_node_by_host_name(conn: Connection, instance: Instance) -> ComputeNode | None:
    """The node of an instance that has no ``compute_id``, matched by its names (logged)."""
    assert instance.compute_id is None
    if not instance.host:
        return None
    node_id = await conn.fetchval(
        f"SELECT {legacy_node_id_sql('i')} FROM instances i WHERE i.id = $1", instance.id
    )
    node = None if node_id is None else await compute_nodes.get_by_id(conn, node_id)
    _log_fallback(instance, node)
    return node


async def node_of(conn: Connection, instance: Instance) -> ComputeNode | None:
    """The live node the instance runs on; ``None`` if unplaced or the node is gone."""
    if instance.compute_id is None:
        return await legacy_node_by_host_name(conn, instance)
    try:
        return await compute_nodes.get_by_id(conn, instance.compute_id)
    except ComputeNodeNotFound:
        return None


async def host_of(conn: Connection, instance: Instance, down_time: float) -> HostState | None:
    """The node and compute service of the instance; ``None`` if either is gone."""
    node = await node_of(conn, instance)
    if node is None or node.service_id is None:
        return None
    try:
        service = await services.get_by_id(conn, node.service_id, down_time)
    except ServiceNotFound:
        return None
    return HostState(node=node, service=service)


async def instances_on(conn: Connection, node: ComputeNode) -> list[Instance]:
    """The live instances on ``node``: linked to it, or unlinked and matched by name."""
    rows = await conn.fetch(
        f"""SELECT i.* FROM instances i
             WHERE i.deleted_at IS NULL
               AND (i.compute_id = $1
                    OR (i.compute_id IS NULL AND i.host IS NOT NULL
                        AND {legacy_node_id_sql("i")} = $1))
             ORDER BY i.created_at DESC, i.id DESC""",
        node.id,
    )
    found = [Instance.from_row(row) for row in rows]
    for instance in found:
        if instance.compute_id is None:
            _log_fallback(instance, node)
    return found


async def count_on(conn: Connection, node_ids: Sequence[int]) -> int:
    """How many live instances run on any of ``node_ids`` (unlinked ones by name)."""
    count: int = await conn.fetchval(
        f"""SELECT count(*) FROM instances i
             WHERE i.deleted_at IS NULL
               AND (i.compute_id = ANY($1::bigint[])
                    OR (i.compute_id IS NULL AND i.host IS NOT NULL
                        AND {legacy_node_id_sql("i")} = ANY($1::bigint[])))""",
        list(node_ids),
    )
    return count
