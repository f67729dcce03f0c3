"""Queries on ``quotas`` (limits an admin set for a project), ``user_quotas`` (limits set
for one user within a project) and on what a project, or one user in it, uses.

Usage is counted from the rows themselves (live instances and their flavors), never
kept in a counter that could drift. To check and consume quota without a race, a
creator takes :func:`lock_project` first: a transaction-scoped advisory lock keyed by
the project, so concurrent creations for one project count and insert one at a time
(in any keel-api process), while other projects are not held up.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from shared.db.pool import Connection

#: First key of the two-key advisory lock that serialises one project's server creations.
_LOCK_CLASS = 0x71756F74  # "quot"


class ProjectUsage(BaseModel):
    """What a project's live servers take."""

    instances: int = 0
    cores: int = 0
    ram: int = 0


async def lock_project(conn: Connection, project_id: str) -> None:
    """Serialise quota-checked creations for ``project_id`` until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, project_id)


#: What resizes still on their way take beyond their servers' current flavors: a server
#: being resized up counts at its larger flavor from the request on (its instance row
#: takes the new flavor only once the destination has built it).
_RESIZING = """
    (SELECT coalesce(sum(greatest((m.new_flavor->>'{field}')::int
                                  - (m.old_flavor->>'{field}')::int, 0)), 0)
       FROM migrations m JOIN instances r ON r.uuid = m.instance_uuid
      WHERE r.project_id = {project} AND r.deleted_at IS NULL {user}
        AND m.migration_type = 'resize' AND m.deleted_at IS NULL
        AND m.status IN ('accepted', 'pre-migrating'))"""


async def usage(conn: Connection, project_id: str) -> ProjectUsage:
    cores = _RESIZING.format(field="vcpus", project="$1", user="")
    ram = _RESIZING.format(field="memory_mb", project="$1", user="")
    row = await conn.fetchrow(
        f"""SELECT count(*) AS instances,
                   coalesce(sum((flavor->>'vcpus')::int), 0) + {cores} AS cores,
                   coalesce(sum((flavor->>'memory_mb')::int), 0) + {ram} AS ram
              FROM instances WHERE project_id = $1 AND deleted_at IS NULL""",
        project_id,
    )
    assert row is not None
    return ProjectUsage(instances=row["instances"], cores=row["cores"], ram=row["ram"])


async def user_usage(conn: Connection, project_id: str, user_id: str) -> ProjectUsage:
    """What one user's live servers in the project take."""
    cores = _RESIZING.format(field="vcpus", project="$1", user="AND r.user_id = $2")
    ram = _RESIZING.format(field="memory_mb", project="$1", user="AND r.user_id = $2")
    row = await conn.fetchrow(
        f"""SELECT count(*) AS instances,
                   coalesce(sum((flavor->>'vcpus')::int), 0) + {cores} AS cores,
                   coalesce(sum((flavor->>'memory_mb')::int), 0) + {ram} AS ram
              FROM instances
             WHERE project_id = $1 AND user_id = $2 AND deleted_at IS NULL""",
        project_id,
        user_id,
    )
    assert row is not None
    return ProjectUsage(instances=row["instances"], cores=row["cores"], ram=row["ram"])


async def user_limits(conn: Connection, project_id: str, user_id: str) -> dict[str, int]:
    """The limits set for the user in the project (others follow the project's)."""
    rows = await conn.fetch(
        "SELECT resource, hard_limit FROM user_quotas WHERE project_id = $1 AND user_id = $2",
        project_id,
        user_id,
    )
    return {row["resource"]: row["hard_limit"] for row in rows}


async def set_user_limits(
    conn: Connection, project_id: str, user_id: str, values: Mapping[str, int]
) -> None:
    async with conn.transaction():
        for resource, limit in values.items():
            await conn.execute(
                """INSERT INTO user_quotas (project_id, user_id, resource, hard_limit)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (project_id, user_id, resource)
                   DO UPDATE SET hard_limit = EXCLUDED.hard_limit, updated_at = now()""",
                project_id,
                user_id,
                resource,
                limit,
            )


async def clear_user(conn: Connection, project_id: str, user_id: str) -> None:
    """Return every limit of the user to the project's."""
    await conn.execute(
        "DELETE FROM user_quotas WHERE project_id = $1 AND user_id = $2", project_id, user_id
    )


async def limits(conn: Connection, project_id: str) -> dict[str, int]:
    """The limits set for the project (resources left at their defaults are absent)."""
    rows = await conn.fetch(
        "SELECT resource, hard_limit FROM quotas WHERE project_id = $1", project_id
    )
    return {row["resource"]: row["hard_limit"] for row in rows}


async def set_limits(conn: Connection, project_id: str, values: Mapping[str, int]) -> None:
    async with conn.transaction():
        for resource, limit in values.items():
            await conn.execute(
                """INSERT INTO quotas (project_id, resource, hard_limit) VALUES ($1, $2, $3)
                   ON CONFLICT (project_id, resource)
                   DO UPDATE SET hard_limit = EXCLUDED.hard_limit, updated_at = now()""",
                project_id,
                resource,
                limit,
            )


async def clear(conn: Connection, project_id: str) -> None:
    """Return every limit of the project to its default, its users' limits included."""
    async with conn.transaction():
        await conn.execute("DELETE FROM quotas WHERE project_id = $1", project_id)
        await conn.execute("DELETE FROM user_quotas WHERE project_id = $1", project_id)


async def class_limits(conn: Connection, class_name: str) -> dict[str, int]:
    """The limits set for a quota class (resources it leaves alone are absent)."""
    rows = await conn.fetch(
        "SELECT resource, hard_limit FROM quota_classes WHERE class_name = $1", class_name
    )
    return {row["resource"]: row["hard_limit"] for row in rows}


class LimitSets(BaseModel):
    """The limits set at each level for one user of a project, and what the project's
    servers take, read in one round trip: the quota class's, the project's and the
    user's limits (each without what it leaves alone)."""

    quota_class: dict[str, int] = {}
    project: dict[str, int] = {}
    user: dict[str, int] = {}
    usage: ProjectUsage = ProjectUsage()


_USAGE_ROWS = f"""
    SELECT 'usage', used.resource, used.amount
      FROM (SELECT count(*)::int AS instances,
                   coalesce(sum((flavor->>'vcpus')::int), 0)
                     + {_RESIZING.format(field="vcpus", project="$2", user="")} AS cores,
                   coalesce(sum((flavor->>'memory_mb')::int), 0)
                     + {_RESIZING.format(field="memory_mb", project="$2", user="")} AS ram
              FROM instances WHERE project_id = $2 AND deleted_at IS NULL) project_usage
      CROSS JOIN LATERAL (VALUES ('instances', project_usage.instances),
                                 ('cores', project_usage.cores),
                                 ('ram', project_usage.ram)) AS used(resource, amount)"""


async def limit_sets(
    conn: Connection, class_name: str, project_id: str, user_id: str | None
) -> LimitSets:
    """What :func:`class_limits`, :func:`limits`, :func:`user_limits` and :func:`usage`
    read, at once (after :func:`lock_project`, the usage is what the check may rely on)."""
    rows = await conn.fetch(
        f"""SELECT 'quota_class' AS level, resource, hard_limit
              FROM quota_classes WHERE class_name = $1
            UNION ALL
            SELECT 'project', resource, hard_limit FROM quotas WHERE project_id = $2
            UNION ALL
            SELECT 'user', resource, hard_limit FROM user_quotas
             WHERE project_id = $2 AND user_id = $3
            UNION ALL {_USAGE_ROWS}""",
        class_name,
        project_id,
        user_id,
    )
    sets: dict[str, dict[str, int]] = {"quota_class": {}, "project": {}, "user": {}, "usage": {}}
    for row in rows:
        sets[row["level"]][row["resource"]] = row["hard_limit"]
    usage = ProjectUsage(**sets.pop("usage"))
    return LimitSets(**sets, usage=usage)


async def set_class_limits(conn: Connection, class_name: str, values: Mapping[str, int]) -> None:
    """Set limits of a quota class; setting the same values again changes nothing else."""
    async with conn.transaction():
        for resource, limit in sorted(values.items()):
            await conn.execute(
                """INSERT INTO quota_classes (class_name, resource, hard_limit)
                   VALUES ($1, $2, $3)
                   ON CONFLICT (class_name, resource)
                   DO UPDATE SET hard_limit = EXCLUDED.hard_limit, updated_at = now()""",
                class_name,
                resource,
                limit,
            )
