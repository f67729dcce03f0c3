"""Queries on ``services``. Up/down is computed against the database clock."""

from __future__ import annotations

import uuid
from uuid import UUID

from shared.db.pool import Connection
from shared.exceptions import ServiceNotFound
from shared.objects.service import Service

#: Selects a service row with ``is_up``; ``$1`` is the service down time in seconds.
SELECT = """
    SELECT s.*,
           (NOT s.forced_down AND s.last_seen_up IS NOT NULL
            AND s.last_seen_up > now() - make_interval(secs => $1)) AS is_up
      FROM services s
"""


async def get_or_create(
    conn: Connection,
    *,
    host: str,
    binary: str,
    topic: str,
    version: int,
    down_time: float,
    new_uuid: UUID | None = None,
    registering: bool = False,
    self_fence_after: float | None = None,
) -> Service:
    """The live service row for (host, binary), created if absent; version stamped.

    A new row gets ``new_uuid`` (the one an agent's broker user names), else a fresh one.
    The row stays locked until the caller's transaction ends, so checks made after this
    call see every registration and rename that committed before it. ``registering``
    stamps ``registered_at`` (an agent starting: see :mod:`shared.db.service_maintenance`)
    and records the agent's ``self_fence_after`` (``None``: its release does not say).
    """
    await conn.execute(
        """INSERT INTO services (uuid, host, "binary", topic, version, registered_at,
                                 self_fence_after)
           VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 THEN now() END, $7)
           ON CONFLICT (host, "binary") WHERE deleted_at IS NULL
           DO UPDATE SET version = EXCLUDED.version, topic = EXCLUDED.topic,
                         registered_at = COALESCE(EXCLUDED.registered_at,
                                                  services.registered_at),
                         self_fence_after = CASE WHEN $6 THEN EXCLUDED.self_fence_after
                                                 ELSE services.self_fence_after END,
                         updated_at = now()""",
        new_uuid or uuid.uuid4(),
        host,
        binary,
        topic,
        version,
        registering,
        self_fence_after,
    )
    row = await conn.fetchrow(
        SELECT + ' WHERE s.host = $2 AND s."binary" = $3 AND s.deleted_at IS NULL',
        down_time,
        host,
        binary,
    )
    assert row is not None
    return Service.from_row(row)


async def heartbeat(
    conn: Connection,
    service_uuid: UUID,
    version: int,
    *,
    agent: bool = False,
    self_fence_after: float | None = None,
    fence_lease: float | None = None,
) -> None:
    """Record that the service is alive, and the version it runs.

    A compute ``agent``'s heartbeat also records its ``self_fence_after`` (``None``: its
    release does not report one) and the lease of its host's fence (``None``: no armed
    fence).
    """
    status = await conn.execute(
        """UPDATE services SET last_seen_up = now(), report_count = report_count + 1,
                  version = $2, updated_at = now(),
                  self_fence_after = CASE WHEN $3 THEN $4 ELSE self_fence_after END,
                  fence_lease = CASE WHEN $3 THEN $5 ELSE fence_lease END
            WHERE uuid = $1 AND deleted_at IS NULL""",
        service_uuid,
        version,
        agent,
        self_fence_after,
        fence_lease,
    )
    if status == "UPDATE 0":
        raise ServiceNotFound(f"service {service_uuid} does not exist or was deleted")


async def get(conn: Connection, service_uuid: UUID, down_time: float) -> Service:
    row = await conn.fetchrow(
        SELECT + " WHERE s.uuid = $2 AND s.deleted_at IS NULL", down_time, service_uuid
    )
    if row is None:
        raise ServiceNotFound(f"service {service_uuid} not found")
    return Service.from_row(row)


async def get_by_id(conn: Connection, service_id: int, down_time: float) -> Service:
    row = await conn.fetchrow(
        SELECT + " WHERE s.id = $2 AND s.deleted_at IS NULL", down_time, service_id
    )
    if row is None:
        raise ServiceNotFound(f"service {service_id} not found")
    return Service.from_row(row)


async def find_compute(conn: Connection, host: str, down_time: float) -> Service | None:
    """The live compute service of ``host``, if it has one."""
    row = await conn.fetchrow(
        SELECT
        + """ WHERE s.host = $2 AND s."binary" = 'keel-compute'
                       AND s.deleted_at IS NULL""",
        down_time,
        host,
    )
    return None if row is None else Service.from_row(row)


async def list_services(
    conn: Connection,
    down_time: float,
    *,
    host: str | None = None,
    binary: str | None = None,
    include_api: bool = False,
) -> list[Service]:
    """Live services, oldest first; keel-api's own rows only with ``include_api``."""
    rows = await conn.fetch(
        SELECT
        + """ WHERE s.deleted_at IS NULL
                AND ($2::text IS NULL OR s.host = $2)
                AND ($3::text IS NULL OR s."binary" = $3)
                AND ($4 OR s."binary" <> 'keel-api')
              ORDER BY s.id""",
        down_time,
        host,
        binary,
        include_api,
    )
    return [Service.from_row(row) for row in rows]


async def list_with_zones(
    conn: Connection,
    down_time: float,
    *,
    host: str | None = None,
    binary: str | None = None,
) -> list[tuple[Service, str | None]]:
    """Live services but keel-api's, each with the zone of its compute node (if any)."""
    rows = await conn.fetch(
        """SELECT s.*, z.availability_zone,
                  (NOT s.forced_down AND s.last_seen_up IS NOT NULL
                   AND s.last_seen_up > now() - make_interval(secs => $1)) AS is_up
             FROM services s
             LEFT JOIN LATERAL (
                  SELECT n.availability_zone FROM compute_nodes n
                   WHERE n.service_id = s.id AND n.deleted_at IS NULL
                   ORDER BY n.id LIMIT 1) z ON true
              WHERE s.deleted_at IS NULL AND s."binary" <> 'keel-api'
                AND ($2::text IS NULL OR s.host = $2)
                AND ($3::text IS NULL OR s."binary" = $3)
              ORDER BY s.id""",
        down_time,
        host,
        binary,
    )
    return [(Service.from_row(row), row["availability_zone"]) for row in rows]


async def update_status(
    conn: Connection,
    service_uuid: UUID,
    down_time: float,
    *,
    disabled: bool | None = None,
    disabled_reason: str | None = None,
    forced_down: bool | None = None,
) -> Service:
    """Change what an operator may change; ``None`` leaves a field as it is.

    Enabling a service clears its disabled reason.
    """
    status = await conn.execute(
        """UPDATE services
              SET disabled = COALESCE($2, disabled),
                  disabled_reason = CASE WHEN $2 IS NULL THEN disabled_reason
                                         WHEN $2 THEN $3 ELSE NULL END,
                  forced_down = COALESCE($4, forced_down),
                  updated_at = now()
            WHERE uuid = $1 AND deleted_at IS NULL""",
        service_uuid,
        disabled,
        disabled_reason,
        forced_down,
    )
    if status == "UPDATE 0":
        raise ServiceNotFound(f"service {service_uuid} not found")
    return await get(conn, service_uuid, down_time)


async def version_counts(conn: Connection, binary: str) -> dict[int, int]:
    """How many live, not forced-down services of ``binary`` run each version."""
    rows = await conn.fetch(
        """SELECT version, count(*) AS n FROM services
            WHERE "binary" = $1 AND deleted_at IS NULL AND NOT forced_down
            GROUP BY version""",
        binary,
    )
    return {row["version"]: row["n"] for row in rows}


async def counted_version(conn: Connection, host: str, binary: str) -> int | None:
    """The version of the row of (host, binary) as :func:`version_counts` counts it.

    ``None`` when the row is absent, deleted or forced down: a row the counts leave out
    is left out here too, so subtracting it from the counts compares like with like.
    """
    version: int | None = await conn.fetchval(
        """SELECT version FROM services
            WHERE host = $1 AND "binary" = $2 AND deleted_at IS NULL AND NOT forced_down""",
        host,
        binary,
    )
    return version


async def minimum_of_the_rest(conn: Connection, binary: str, host: str) -> int:
    """The oldest version among the live, not forced-down services of ``binary`` other
    than the one of ``host``; 0 when there are none. Read from the database, not a cache.
    """
    version: int | None = await conn.fetchval(
        """SELECT min(version) FROM services
            WHERE "binary" = $1 AND deleted_at IS NULL AND NOT forced_down AND host <> $2""",
        binary,
        host,
    )
    return version or 0


async def older_than(
    conn: Connection, binary: str, version: int, down_time: float
) -> list[Service]:
    """Live, not forced-down services of ``binary`` stamped below ``version``, oldest first."""
    rows = await conn.fetch(
        SELECT
        + """ WHERE s.deleted_at IS NULL AND NOT s.forced_down AND s."binary" = $2
                AND s.version < $3
              ORDER BY s.version, s.host""",
        down_time,
        binary,
        version,
    )
    return [Service.from_row(row) for row in rows]
