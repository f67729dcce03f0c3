"""The scheduler's candidate hosts, read from PostgreSQL a few at a time.

Instead of loading every host for every request, the scheduler asks for the best
``limit`` hosts that pass its filters' SQL conditions, in the order of its first weigher:
one query walking an index on free RAM (``compute_nodes_free_ram``, migration 0008) and
stopping after ``limit`` rows, so a request reads about the same number of rows in a
cloud of 100 hosts as in one of 10,000. The filters then run again, in Python, on those
few hosts, and the claim re-checks capacity atomically; the SQL conditions only decide
which hosts are worth reading.

Conditions are SQL fragments over the aliases ``n`` (``compute_nodes``) and ``s``
(``services``); values are bound with :meth:`HostSql.bind`, never formatted in. ``$1``
is always the service down time, so :data:`IS_UP` can be used by any condition.

:func:`filter_counts` is the slow path for a request no host can take: one aggregate
query counting, filter by filter, how many hosts are left, for the operator's log line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.db.pool import Connection
from shared.objects.compute_node import ComputeNode, HostState
from shared.objects.service import Service

#: Usable free capacity, allocation ratios included. The free-RAM expression must stay
#: exactly as the index ``compute_nodes_free_ram`` spells it, or the index goes unused.
FREE_VCPUS = "(n.vcpus * n.cpu_allocation_ratio - n.vcpus_used)"
FREE_RAM_MB = "(n.memory_mb * n.ram_allocation_ratio - n.memory_mb_used)"
FREE_DISK_GB = "(n.local_gb * n.disk_allocation_ratio - n.local_gb_used)"

#: The service is up: heartbeat within the down time (``$1``) and not forced down.
IS_UP = (
    "(NOT s.forced_down AND s.last_seen_up IS NOT NULL"
    " AND s.last_seen_up > now() - make_interval(secs => $1))"
)

#: The metadata of the host's live aggregates: key → every value they give it.
AGGREGATE_METADATA = """COALESCE((
    SELECT jsonb_object_agg(x.key, x.vals) FROM (
        SELECT m.key, jsonb_agg(DISTINCT m.value) AS vals
          FROM aggregate_hosts h
          JOIN aggregates a ON a.id = h.aggregate_id AND a.deleted_at IS NULL
          JOIN aggregate_metadata m ON m.aggregate_id = a.id
         WHERE h.service_id = s.id
         GROUP BY m.key) x), '{}'::jsonb)"""

_FROM = """
      FROM compute_nodes n JOIN services s ON s.id = n.service_id
     WHERE n.deleted_at IS NULL AND s.deleted_at IS NULL
"""


class HostSql:
    """Bound arguments and conditions of one candidate query, built together."""

    def __init__(self, down_time: float) -> None:
        self.args: list[Any] = [down_time]

    def bind(self, value: Any) -> str:
        self.args.append(value)
        return f"${len(self.args)}"


async def top_candidates(
    conn: Connection,
    sql: HostSql,
    conditions: Sequence[str],
    *,
    order: str,
    limit: int,
    offset: int = 0,
) -> list[HostState]:
    """Up to ``limit`` hosts meeting every condition, best first by ``order``.

    ``order`` is an SQL ``ORDER BY`` list; it should end with ``n.id`` so that equal
    hosts come in a stable order. ``limit`` and ``offset`` are the caller's own integers,
    written into the query so that the planner sees them.
    """
    where = "".join(f"\n       AND {condition}" for condition in conditions)
    rows = await conn.fetch(
        f"""SELECT to_jsonb(n.*) AS node,
                   to_jsonb(s.*) || jsonb_build_object('is_up', {IS_UP}) AS service,
                   {AGGREGATE_METADATA} AS aggregate_metadata
              {_FROM}{where}
             ORDER BY {order}
             LIMIT {int(limit)} OFFSET {int(offset)}""",
        *sql.args,
    )
    return [
        HostState(
            node=ComputeNode.from_row(r["node"]),
            service=Service.from_row(r["service"]),
            aggregate_metadata=r["aggregate_metadata"],
        )
        for r in rows
    ]


async def filter_counts(
    conn: Connection, sql: HostSql, conditions: Sequence[str | None]
) -> tuple[int, list[int]]:
    """Live hosts, and how many are left after each condition in turn (``None`` keeps all)."""
    columns: list[str] = []
    applied: list[str] = []
    for condition in conditions:
        if condition is not None:
            applied.append(condition)
        test = " AND ".join(applied) or "true"
        columns.append(f"count(*) FILTER (WHERE {test})")
    select = ", ".join(["count(*)", *columns])
    # $1 (the down time) is typed here too: the conditions of a forced destination do
    # not use it, and PostgreSQL refuses a parameter it cannot type.
    row = await conn.fetchrow(f"SELECT {select} {_FROM} AND $1::float8 >= 0", *sql.args)
    assert row is not None
    values = [int(value) for value in row.values()]
    return values[0], values[1:]
