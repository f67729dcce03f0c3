"""Queries of the conductors' automatic evacuation (:mod:`services.conductor.recovery`).

The compute hosts with what decides whether they are fenced, the servers of a host that
may be evacuated automatically, and ``host_recoveries``: one row per host whose
servers the conductors started evacuating, which paces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from shared.db.pool import Connection
from shared.objects.compute_node import ComputeNode
from shared.objects.service import Service
from shared.objects.states import VmState

#: The metadata key (and value, in any case) that marks a server for ``tagged``
#: automatic evacuation: Masakari's convention.
HA_KEY = "HA_Enabled"
HA_VALUE = "true"

#: What is evacuated automatically: a server running or stopped, with no task. One in
#: ERROR (a failed evacuation left it) waits for an operator.
MOVABLE = (VmState.ACTIVE, VmState.STOPPED)

#: The session-level advisory lock a conductor holds while it starts evacuations, so
#: that conductors pace hosts one at a time between them.
LOCK_KEY = 0x6B72  # "kr"


@dataclass(frozen=True)
class ComputeHost:
    service: Service
    #: The availability zone of its node (``None`` if it has none).
    zone: str | None
    #: Seconds since its last heartbeat by the database's clock; ``None``: never sent one.
    silent_for: float | None
    nodes: tuple[ComputeNode, ...]


async def compute_hosts(conn: Connection, down_time: float) -> list[ComputeHost]:
    """Every live compute service with its nodes and zone, oldest first."""
    rows = await conn.fetch(
        """SELECT s.*,
                  (NOT s.forced_down AND s.last_seen_up IS NOT NULL
                   AND s.last_seen_up > now() - make_interval(secs => $1)) AS is_up,
                  EXTRACT(EPOCH FROM now() - s.last_seen_up)::float8 AS silent_for
             FROM services s
            WHERE s.deleted_at IS NULL AND s."binary" = 'keel-compute'
            ORDER BY s.id""",
        down_time,
    )
    nodes = await conn.fetch(
        """SELECT * FROM compute_nodes
            WHERE deleted_at IS NULL AND service_id IS NOT NULL
            ORDER BY id"""
    )
    by_service: dict[int, list[ComputeNode]] = {}
    for row in nodes:
        by_service.setdefault(row["service_id"], []).append(ComputeNode.from_row(row))
    found = []
    for row in rows:
        mine = tuple(by_service.get(row["id"], []))
        found.append(
            ComputeHost(
                service=Service.from_row(row),
                zone=mine[0].availability_zone if mine else None,
                silent_for=row["silent_for"],
                nodes=mine,
            )
        )
    return found


async def evacuable(
    conn: Connection, node_ids: list[int], *, tagged: bool
) -> list[tuple[UUID, int]]:
    """The servers on ``node_ids`` that may be evacuated automatically, oldest first, each
    with the id of its node."""
    rows = await conn.fetch(
        """SELECT uuid, compute_id FROM instances
            WHERE compute_id = ANY($1::bigint[]) AND deleted_at IS NULL
              AND task_state IS NULL AND vm_state = ANY($2::text[])
              AND (NOT $3 OR lower(metadata ->> $4) = $5)
            ORDER BY id""",
        node_ids,
        [state.value for state in MOVABLE],
        tagged,
        HA_KEY,
        HA_VALUE,
    )
    return [(row["uuid"], row["compute_id"]) for row in rows]


async def seconds_since_last_start(conn: Connection) -> float | None:
    """Seconds since the conductors last started evacuating a host; ``None``: never."""
    seconds: float | None = await conn.fetchval(
        "SELECT EXTRACT(EPOCH FROM now() - max(started_at))::float8 FROM host_recoveries"
    )
    return seconds


async def start(conn: Connection, service: Service) -> int:
    """Record that the conductors start evacuating ``service``'s host; the row's id."""
    recovery_id: int = await conn.fetchval(
        "INSERT INTO host_recoveries (service_id, host) VALUES ($1, $2) RETURNING id",
        service.id,
        service.host,
    )
    return recovery_id


async def finish(conn: Connection, recovery_id: int, *, evacuations: int, skipped: int) -> None:
    """How many evacuations the recovery started, and how many servers it skipped."""
    await conn.execute(
        "UPDATE host_recoveries SET evacuations = $2, skipped = $3 WHERE id = $1",
        recovery_id,
        evacuations,
        skipped,
    )
