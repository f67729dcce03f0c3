"""A throw-away keel database for a benchmark, hosts in bulk, and the capacity invariant.

:func:`scratch_database` (from :mod:`devkit.database`) gives a fresh, migrated database
on the server and drops it on the way out, even on failure, so benchmarks never touch
anyone else's data.
:func:`add_hosts` registers compute hosts in two statements (a service and a node each,
heartbeating now), so 10,000 hosts take seconds, not minutes. :func:`check_capacity` is
the scheduler's invariant every benchmark checks after it ran: each node's usage equals
the sum of its allocations (``allocations.usage_drift``) and no node is over capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from devkit.database import scratch_database
from devkit.servers import pg_server
from shared.db import allocations
from shared.db.host_candidates import FREE_DISK_GB, FREE_RAM_MB, FREE_VCPUS
from shared.db.pool import Connection
from shared.versions import SERVICE_VERSION

__all__ = [
    "DEFAULT_PG_SERVER",
    "CapacityCheck",
    "HostSize",
    "add_hosts",
    "check_capacity",
    "reset_claims",
    "scratch_database",
]

DEFAULT_PG_SERVER = pg_server("KEEL_BENCH_PG")


@dataclass(frozen=True)
class HostSize:
    vcpus: int
    memory_mb: int
    local_gb: int


async def add_hosts(
    conn: Connection, first: int, count: int, size: HostSize, *, prefix: str = "bench"
) -> None:
    """Hosts ``prefix-<first>`` … as registered, heartbeating agents (ratios 1.0)."""
    await conn.execute(
        """INSERT INTO services (uuid, host, "binary", topic, version, last_seen_up, report_count)
           SELECT gen_random_uuid(), $1 || '-' || lpad(g::text, 5, '0'), 'keel-compute',
                  'compute', $4, now(), 1
             FROM generate_series($2::int, $2::int + $3::int - 1) AS g""",
        prefix,
        first,
        count,
        SERVICE_VERSION,
    )
    await conn.execute(
        """INSERT INTO compute_nodes
               (uuid, service_id, host, hypervisor_hostname, vcpus, memory_mb, local_gb,
                cpu_allocation_ratio, ram_allocation_ratio, disk_allocation_ratio)
           SELECT gen_random_uuid(), s.id, s.host, s.host, $2, $3, $4, 1.0, 1.0, 1.0
             FROM services s
            WHERE s."binary" = 'keel-compute' AND s.host LIKE $1 || '-%'
              AND NOT EXISTS (SELECT 1 FROM compute_nodes n WHERE n.service_id = s.id)""",
        prefix,
        size.vcpus,
        size.memory_mb,
        size.local_gb,
    )
    await conn.execute("ANALYZE services; ANALYZE compute_nodes")


async def reset_claims(conn: Connection) -> None:
    """Release every claim and mark every host alive, for the next run."""
    async with conn.transaction():
        await conn.execute("DELETE FROM allocations")
        await conn.execute(
            "UPDATE compute_nodes SET vcpus_used = 0, memory_mb_used = 0, local_gb_used = 0"
        )
        await conn.execute("UPDATE services SET last_seen_up = now()")


@dataclass(frozen=True)
class CapacityCheck:
    nodes: int
    allocations: int
    over_capacity: int
    usage_drift: int

    @property
    def passed(self) -> bool:
        return self.over_capacity == 0 and self.usage_drift == 0

    def figures(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "allocations": self.allocations,
            "over_capacity": self.over_capacity,
            "usage_drift": self.usage_drift,
            "result": "ok" if self.passed else "FAILED",
        }


async def check_capacity(conn: Connection) -> CapacityCheck:
    """The invariant: usage equals allocations on every node, and none is over capacity."""
    drift = await allocations.usage_drift(conn)
    row = await conn.fetchrow(
        f"""SELECT count(*) AS nodes,
                   count(*) FILTER (WHERE {FREE_VCPUS} < 0 OR {FREE_RAM_MB} < 0
                                       OR {FREE_DISK_GB} < 0) AS over,
                   (SELECT count(*) FROM allocations) AS allocations
              FROM compute_nodes n WHERE n.deleted_at IS NULL"""
    )
    assert row is not None
    return CapacityCheck(
        nodes=row["nodes"],
        allocations=row["allocations"],
        over_capacity=row["over"],
        usage_drift=len(drift),
    )
