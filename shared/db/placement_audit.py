"""Which claims no live server or move justifies, and which servers and moves lack theirs.

A claim (a row of ``allocations``) is held by a consumer on one compute node and serves
one instance. It is **justified** when one of these holds, with the instance live (not
deleted):

* the consumer is the instance itself, and

  - the instance is building (its build owns it, with the build deadline), or
  - the node is the instance's node (``compute_id``; for a row an older release wrote,
    its node matched by name), or
  - the node is the source of a move of the instance that keeps its claim there: an
    evacuation ``done`` (until the source confirms it removed its copy) or a cold
    migration ``finished``, ``confirming`` or ``reverting`` (the copy a revert returns
    to);

* the consumer is a move of the instance (a migration record), and the node is its
  destination while it is ``pre-migrating``, ``finished`` or ``confirming`` (or
  ``reverting``, as long as the instance is still linked to the destination); while
  ``accepted``, any node (the scheduler claims before the destination is recorded).

A claim that is not justified but belongs to a move that ended in ``error`` — a confirm
or revert an agent could not do, which keeps both claims — while its server is still in
ERROR is **held for an operator**: listed, never removed here. Every other claim is a
**leak**. :func:`release_leak` removes one, as a compare-and-swap: it locks the instance
and its migrations, then deletes the claim only if it is still a leak.

Conversely a live instance on a live node must hold a claim there (its own, or that of
its move to that node, justified or held as above), unless its build failed before it
ever ran (ERROR, never launched: the build released its claim). A move must hold its
destination while it holds one (as above), and a move that keeps the source (as above)
must find the instance's claim there, while that node is live.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from shared.db import allocations
from shared.db.placement import node_id_sql
from shared.db.pool import Connection
from shared.objects.instance import Allocation

LOG = logging.getLogger(__name__)

#: A move holds its claim on the destination in these statuses (``accepted``: anywhere).
DEST_HELD = ("accepted", "pre-migrating", "finished", "confirming", "reverting")
_DEST_HELD_SQL = ", ".join(f"'{status}'" for status in DEST_HELD)
#: A move keeps the instance's claim on its source (the other copy) in these.
_SOURCE_KEPT = """((m.migration_type = 'evacuation' AND m.status = 'done')
                   OR (m.migration_type <> 'evacuation'
                       AND m.status IN ('finished', 'confirming', 'reverting')))"""


def _justified(a: str) -> str:
    """SQL: the claim ``a`` is justified by a live server or move."""
    return f"""(
        EXISTS (SELECT 1 FROM instances i
                 WHERE i.uuid = {a}.instance_uuid AND i.deleted_at IS NULL
                   AND {a}.consumer_uuid = i.uuid
                   AND (i.vm_state = 'building'
                        OR {node_id_sql("i")} = {a}.compute_node_id
                        OR EXISTS (SELECT 1 FROM migrations m
                                    WHERE m.instance_uuid = i.uuid AND m.deleted_at IS NULL
                                      AND m.source_compute_id = {a}.compute_node_id
                                      AND {_SOURCE_KEPT})))
        OR EXISTS (SELECT 1 FROM migrations m
                     JOIN instances i ON i.uuid = m.instance_uuid AND i.deleted_at IS NULL
                    WHERE m.uuid = {a}.consumer_uuid AND m.instance_uuid = {a}.instance_uuid
                      AND m.deleted_at IS NULL AND m.status IN ({_DEST_HELD_SQL})
                      AND (m.dest_compute_id = {a}.compute_node_id
                           OR (m.status = 'accepted' AND m.dest_compute_id IS NULL))
                      AND (m.status <> 'reverting'
                           OR {node_id_sql("i")} = m.dest_compute_id)))"""


def _held(a: str) -> str:
    """SQL: the claim ``a`` is kept by a move that ended in error, its server in ERROR."""
    return f"""EXISTS (
        SELECT 1 FROM migrations m
          JOIN instances i ON i.uuid = m.instance_uuid AND i.deleted_at IS NULL
         WHERE m.instance_uuid = {a}.instance_uuid AND m.deleted_at IS NULL
           AND m.status = 'error' AND i.vm_state = 'error'
           AND ((m.uuid = {a}.consumer_uuid AND m.dest_compute_id = {a}.compute_node_id)
                OR ({a}.consumer_uuid = i.uuid AND m.source_compute_id = {a}.compute_node_id)))"""


class Verdict(StrEnum):
    LEAK = "leak"
    HELD = "held for an operator"


@dataclass(frozen=True)
class Claim:
    """A claim that is not justified, with what explains it."""

    id: int
    allocation: Allocation
    verdict: Verdict
    host: str | None
    node: str | None
    #: Why it is not justified, in words.
    reason: str


@dataclass(frozen=True)
class Missing:
    """A server or move without the claim it needs."""

    instance_uuid: UUID
    #: The move, when a move lacks it.
    migration_uuid: UUID | None
    node_id: int
    host: str
    node: str
    reason: str


def _reason(row: dict[str, object]) -> str:
    """Why a claim that is not justified is so (explanation only; the verdict is SQL's)."""
    if row["vm_state"] is None:
        return "its server does not exist"
    if row["instance_deleted"]:
        return "its server was deleted"
    if row["migration_status"] is not None:
        if row["verdict"] == Verdict.HELD:
            return f"its {row['migration_type']} {row['consumer_uuid']} ended in error"
        return (
            f"it is held by {row['migration_type']} {row['consumer_uuid']}, which is "
            f"{row['migration_status']} and does not hold this node"
        )
    if row["consumer_uuid"] != row["instance_uuid"]:
        return f"its consumer {row['consumer_uuid']} is neither the server nor a move of it"
    return "the server is on another node, and no unfinished move of it left this one"


async def unjustified(conn: Connection) -> list[Claim]:
    """Every claim that is not justified: leaks and claims held for an operator, by id."""
    rows = await conn.fetch(
        f"""SELECT a.*, n.host, n.hypervisor_hostname,
                   i.vm_state, i.deleted_at IS NOT NULL AS instance_deleted,
                   m.status AS migration_status, m.migration_type,
                   CASE WHEN {_held("a")} THEN 'held for an operator' ELSE 'leak' END AS verdict
              FROM allocations a
              LEFT JOIN compute_nodes n ON n.id = a.compute_node_id
              LEFT JOIN instances i ON i.uuid = a.instance_uuid
              LEFT JOIN migrations m ON m.uuid = a.consumer_uuid
             WHERE NOT {_justified("a")}
             ORDER BY a.id"""
    )
    return [
        Claim(
            id=row["id"],
            allocation=Allocation.from_row(row),
            verdict=Verdict(row["verdict"]),
            host=row["host"],
            node=row["hypervisor_hostname"],
            reason=_reason(dict(row)),
        )
        for row in rows
    ]


async def release_leak(conn: Connection, claim: Claim) -> Allocation | None:
    """Remove the claim if it is still a leak; ``None`` if something now justifies (or
    holds) it, or it is gone. Locks in keel's order: the instance, its migrations, the
    claim (then its node, to give the usage back)."""
    async with conn.transaction():
        await conn.execute(
            "SELECT 1 FROM instances WHERE uuid = $1 FOR UPDATE", claim.allocation.instance_uuid
        )
        await conn.execute(
            "SELECT 1 FROM migrations WHERE instance_uuid = $1 ORDER BY id FOR UPDATE",
            claim.allocation.instance_uuid,
        )
        released = await allocations.release_where(
            conn,
            f"allocations.id = $1 AND NOT {_justified('allocations')} "
            f"AND NOT {_held('allocations')}",
            claim.id,
        )
    if not released:
        return None
    LOG.warning(
        "released claim of consumer %s (server %s) on compute node %d: %d vCPUs, %d MB, %d GB; %s",
        claim.allocation.consumer_uuid,
        claim.allocation.instance_uuid,
        claim.allocation.compute_node_id,
        claim.allocation.vcpus,
        claim.allocation.memory_mb,
        claim.allocation.local_gb,
        claim.reason,
        extra={
            "instance_uuid": str(claim.allocation.instance_uuid),
            "decision": "leaked_claim_released",
        },
    )
    return released[0]


_HOLDS_HERE = """EXISTS (SELECT 1 FROM allocations a
                 WHERE a.instance_uuid = i.uuid AND a.compute_node_id = n.id
                   AND (a.consumer_uuid = i.uuid
                        OR EXISTS (SELECT 1 FROM migrations m
                                    WHERE m.uuid = a.consumer_uuid
                                      AND m.dest_compute_id = n.id
                                      AND (m.status IN ('finished', 'confirming', 'reverting')
                                           OR (m.status = 'error'
                                               AND i.vm_state = 'error')))))"""


async def missing(conn: Connection) -> list[Missing]:
    """Servers on a live node without a claim there, and moves without theirs."""
    servers = await conn.fetch(
        f"""SELECT i.uuid AS instance_uuid, NULL::uuid AS migration_uuid, n.id AS node_id,
                   n.host, n.hypervisor_hostname AS node,
                   'the server has no claim on its node' AS reason
              FROM instances i
              JOIN compute_nodes n ON n.id = {node_id_sql("i")} AND n.deleted_at IS NULL
             WHERE i.deleted_at IS NULL
               AND NOT (i.vm_state = 'error' AND i.launched_at IS NULL)
               AND NOT {_HOLDS_HERE}
             ORDER BY i.id"""
    )
    destinations = await conn.fetch(
        f"""SELECT m.instance_uuid, m.uuid AS migration_uuid, n.id AS node_id, n.host,
                   n.hypervisor_hostname AS node,
                   format('its %s (%s) has no claim on its destination',
                          m.migration_type, m.status) AS reason
              FROM migrations m
              JOIN instances i ON i.uuid = m.instance_uuid AND i.deleted_at IS NULL
              JOIN compute_nodes n ON n.id = m.dest_compute_id AND n.deleted_at IS NULL
             WHERE m.deleted_at IS NULL
               AND m.status IN ('pre-migrating', 'finished', 'confirming', 'reverting')
               AND (m.status <> 'reverting' OR {node_id_sql("i")} = m.dest_compute_id)
               AND NOT EXISTS (SELECT 1 FROM allocations a
                                WHERE a.consumer_uuid = m.uuid AND a.compute_node_id = n.id)
             ORDER BY m.id"""
    )
    sources = await conn.fetch(
        f"""SELECT m.instance_uuid, m.uuid AS migration_uuid, n.id AS node_id, n.host,
                   n.hypervisor_hostname AS node,
                   format('its %s (%s) keeps the copy here, but the server has no claim on '
                          'its source', m.migration_type, m.status) AS reason
              FROM migrations m
              JOIN instances i ON i.uuid = m.instance_uuid AND i.deleted_at IS NULL
              JOIN compute_nodes n ON n.id = m.source_compute_id AND n.deleted_at IS NULL
             WHERE m.deleted_at IS NULL AND {_SOURCE_KEPT}
               AND NOT EXISTS (SELECT 1 FROM allocations a
                                WHERE a.consumer_uuid = i.uuid AND a.compute_node_id = n.id)
             ORDER BY m.id"""
    )
    return [
        Missing(
            instance_uuid=row["instance_uuid"],
            migration_uuid=row["migration_uuid"],
            node_id=row["node_id"],
            host=row["host"],
            node=row["node"],
            reason=row["reason"],
        )
        for row in (*servers, *destinations, *sources)
    ]
