"""Online data migrations: backfills of links that older releases did not record.

Schema changes (``keel-manage db sync``) add columns; filling them on existing rows is
left to ``keel-manage db online-data-migrations``, which runs the backfills registered
in :data:`MIGRATIONS` while every service keeps running:

* each backfill walks its table in id order (keyset ranges, never ``OFFSET``), in short
  transactions of at most :data:`BATCH_SIZE` rows, locking only the rows of one batch;
* a row is written only while it still needs the link (``... IS NULL``), so running two
  at once, or again, or alongside the services that set the link themselves, changes
  each row once;
* a row whose link cannot be resolved (say, an instance whose host has no compute node
  any more, or none with the row's node name) is never guessed: it is reported, with
  the nodes its host does have, and left NULL.

:func:`unlinked_rows` counts what is left, for upgrade checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.db import placement
from shared.db.pool import Connection

#: Rows per transaction: about 40 ms of row locks per batch on a small machine, and twice
#: the throughput of batches of 50 (``bench/backfill.py``; figures in bench/RESULTS.md).
BATCH_SIZE = 1000
#: Unresolvable rows listed per migration in a report (all are counted).
UNRESOLVED_SHOWN = 20


@dataclass(frozen=True)
class Backfill:
    """One registered backfill: fill ``column`` of ``table`` rows matching ``needs``."""

    #: What operators see, e.g. ``instances.compute_id``.
    name: str
    table: str
    column: str
    #: The rows that need the link (the table is aliased ``t``).
    needs: str
    #: The value to link each row to; NULL when it cannot be resolved.
    target: str
    #: A text describing one row, for the report of unresolved rows.
    describe: str


INSTANCE_COMPUTE_ID = Backfill(
    name="instances.compute_id",
    table="instances",
    column="compute_id",
    needs="t.compute_id IS NULL AND t.host IS NOT NULL AND t.deleted_at IS NULL",
    target=placement.legacy_node_id_sql("t"),
    describe=(
        "format('instance %s (host %s, node %s): no live compute node of that host has that"
        " name (its nodes: %s)', t.uuid, t.host, coalesce(t.node, '-'),"
        " coalesce((SELECT string_agg(n.hypervisor_hostname, ', ' ORDER BY n.id)"
        " FROM compute_nodes n WHERE n.host = t.host AND n.deleted_at IS NULL), 'none'))"
    ),
)

NODE_SERVICE_ID = Backfill(
    name="compute_nodes.service_id",
    table="compute_nodes",
    column="service_id",
    needs="t.service_id IS NULL AND t.deleted_at IS NULL",
    target=(
        "(SELECT s.id FROM services s WHERE s.host = t.host"
        " AND s.\"binary\" = 'keel-compute' AND s.deleted_at IS NULL)"
    ),
    describe=(
        "format('compute node %s (host %s): no live compute service on that host', t.uuid, t.host)"
    ),
)

#: Every backfill, in the order they run.
MIGRATIONS: tuple[Backfill, ...] = (NODE_SERVICE_ID, INSTANCE_COMPUTE_ID)


async def run(
    conn: Connection, backfill: Backfill, limit: int, *, batch_size: int = BATCH_SIZE
) -> int:
    """Link up to ``limit`` resolvable rows, batch by batch; return how many were linked."""
    done = 0
    after = 0
    while done < limit:
        size = min(batch_size, limit - done)
        async with conn.transaction():
            rows = await conn.fetch(
                f"""SELECT t.id, {backfill.target} AS target FROM {backfill.table} t
                     WHERE {backfill.needs} AND t.id > $1 AND {backfill.target} IS NOT NULL
                     ORDER BY t.id LIMIT $2
                       FOR UPDATE OF t""",
                after,
                size,
            )
            if not rows:
                return done
            status = await conn.execute(
                f"""UPDATE {backfill.table} t SET {backfill.column} = b.target
                      FROM unnest($1::bigint[], $2::bigint[]) AS b(id, target)
                     WHERE t.id = b.id AND t.{backfill.column} IS NULL""",
                [row["id"] for row in rows],
                [row["target"] for row in rows],
            )
        done += int(status.rpartition(" ")[2])
        after = rows[-1]["id"]
    return done


async def remaining(conn: Connection, backfill: Backfill) -> int:
    """Rows that still need the link and can be resolved."""
    count: int = await conn.fetchval(
        f"""SELECT count(*) FROM {backfill.table} t
             WHERE {backfill.needs} AND {backfill.target} IS NOT NULL"""
    )
    return count


async def pending(conn: Connection, backfill: Backfill) -> int:
    """Rows that still need the link, resolvable or not."""
    count: int = await conn.fetchval(
        f"SELECT count(*) FROM {backfill.table} t WHERE {backfill.needs}"
    )
    return count


async def unresolved(conn: Connection, backfill: Backfill) -> tuple[int, list[str]]:
    """How many rows need the link but cannot be resolved, and the first few of them."""
    rows = await conn.fetch(
        f"""SELECT {backfill.describe} AS what, count(*) OVER () AS total
              FROM {backfill.table} t
             WHERE {backfill.needs} AND {backfill.target} IS NULL
             ORDER BY t.id LIMIT $1""",
        UNRESOLVED_SHOWN,
    )
    return (rows[0]["total"] if rows else 0), [row["what"] for row in rows]


async def unlinked_rows(conn: Connection) -> dict[str, int]:
    """Per backfill, the rows still without their link (for ``status upgrade-check``)."""
    return {backfill.name: await pending(conn, backfill) for backfill in MIGRATIONS}
