"""Quota enforcement: a project's limits, and the checks made before creating things.

A project's limit for a resource is what an admin set (``os-quota-sets``), else the
default: the ``default`` quota class's limit where an admin set one
(``os-quota-class-sets/default``, kept in the database so every keel-api agrees), else
the setting (``KEEL_QUOTA__*``); -1 means unlimited. An admin may also set
a limit for one user in a project (``os-quota-sets/{project}?user_id=``): that user's
own servers (or key pairs) count against it, on top of the project's limit. keel
enforces ``instances``, ``cores`` and ``ram`` per project and per user where a user
limit is set, ``key_pairs`` per user (with the user's limit, else the project's),
``metadata_items`` per server, ``server_groups`` per project and
``server_group_members`` per group. The other limits the compute API reports (injected
files) concern features keel does not have: they are stored and shown so clients can
set and read them, and nothing can exceed them.

The checks run inside the caller's transaction, after a lock that serialises the
project's (or user's) creations, so what was counted is still true when the new row is
committed: concurrent requests never exceed a quota together.
"""

from __future__ import annotations

from shared.config import QuotaSettings
from shared.db import key_pairs, quotas, server_groups
from shared.db.pool import Connection
from shared.exceptions import OverQuota
from shared.objects.flavor import FlavorSnapshot

#: Limits of features keel does not have, at the compute API's defaults.
UNUSED_DEFAULTS = {
    "injected_files": 5,
    "injected_file_content_bytes": 10240,
    "injected_file_path_bytes": 255,
}
UNLIMITED = -1
#: The quota class whose limits are every project's defaults.
DEFAULT_CLASS = "default"


def defaults(settings: QuotaSettings) -> dict[str, int]:
    """Every resource's default limit from the settings alone."""
    return {**settings.model_dump(), **UNUSED_DEFAULTS}


async def class_limits(
    conn: Connection, class_name: str, settings: QuotaSettings
) -> dict[str, int]:
    """Every resource's limit in a quota class: what was set for it, else the setting."""
    return {**defaults(settings), **await quotas.class_limits(conn, class_name)}


async def default_limits(conn: Connection, settings: QuotaSettings) -> dict[str, int]:
    """Every resource's default limit: the ``default`` class's, else the setting."""
    return await class_limits(conn, DEFAULT_CLASS, settings)


async def project_limits(
    conn: Connection, project_id: str, settings: QuotaSettings
) -> dict[str, int]:
    """Every resource's limit for the project: what was set, else the default."""
    return {**await default_limits(conn, settings), **await quotas.limits(conn, project_id)}


async def user_limits(
    conn: Connection, project_id: str, user_id: str, settings: QuotaSettings
) -> dict[str, int]:
    """Every resource's limit for one user of the project: the user's, else the project's."""
    return {
        **await project_limits(conn, project_id, settings),
        **await quotas.user_limits(conn, project_id, user_id),
    }


def _over(limit: int, used: int, requested: int) -> bool:
    return limit != UNLIMITED and used + requested > limit


def _check(limits: dict[str, int], usage: quotas.ProjectUsage, wanted: dict[str, int]) -> None:
    used = {"cores": usage.cores, "instances": usage.instances, "ram": usage.ram}
    overs = sorted(r for r in wanted if _over(limits[r], used[r], wanted[r]))
    if overs:
        raise OverQuota.exceeded(
            overs,
            [wanted[r] for r in overs],
            [used[r] for r in overs],
            [limits[r] for r in overs],
        )


def _room(limits: dict[str, int], usage: quotas.ProjectUsage, flavor: FlavorSnapshot) -> float:
    """How many servers of ``flavor`` fit between ``usage`` and ``limits``."""
    each = {"instances": 1, "cores": flavor.vcpus, "ram": flavor.memory_mb}
    used = {"instances": usage.instances, "cores": usage.cores, "ram": usage.ram}
    room = float("inf")
    for resource, need in each.items():
        limit = limits[resource]
        if limit != UNLIMITED and need > 0:
            room = min(room, max(0, limit - used[resource]) // need)
    return room


async def new_servers(
    conn: Connection,
    project_id: str,
    settings: QuotaSettings,
    flavor: FlavorSnapshot,
    metadata_items: int = 0,
    *,
    user_id: str | None = None,
    min_count: int = 1,
    max_count: int = 1,
) -> int:
    """How many servers of ``flavor`` to create, from ``min_count`` to ``max_count``: as
    many as the project (and ``user_id``, where a limit is set for them) has room for, as
    Nova does; :class:`OverQuota` if not even ``min_count`` fit, or if one server would
    have more metadata items than allowed.

    Call it inside the transaction that inserts the servers: it takes the project's lock,
    then reads every level's limits and the project's usage in one round trip.
    """
    await quotas.lock_project(conn, project_id)
    sets = await quotas.limit_sets(conn, DEFAULT_CLASS, project_id, user_id)
    limits = {**defaults(settings), **sets.quota_class, **sets.project}
    check_metadata_items(limits, metadata_items)
    usage = sets.usage
    room = _room(limits, usage, flavor)
    own = sets.user if user_id is not None else {}
    mine = await quotas.user_usage(conn, project_id, user_id) if own and user_id else None
    if mine is not None:
        room = min(room, _room({**limits, **own}, mine, flavor))
    count = max(int(min(room, max_count)), min_count)
    wanted = {"cores": flavor.vcpus * count, "instances": count, "ram": flavor.memory_mb * count}
    _check(limits, usage, wanted)
    if mine is not None and own.keys() & wanted.keys():
        _check({**limits, **own}, mine, wanted)
    return count


async def check_resize(
    conn: Connection,
    project_id: str,
    settings: QuotaSettings,
    old: FlavorSnapshot,
    new: FlavorSnapshot,
    *,
    user_id: str | None = None,
) -> None:
    """Raise :class:`OverQuota` unless the project (and ``user_id``, where a limit is set
    for them) has room for what resizing one server from ``old`` to ``new`` adds.

    Call it inside the transaction that records the resize: it takes the project's lock.
    """
    await quotas.lock_project(conn, project_id)
    wanted = {
        "cores": max(0, new.vcpus - old.vcpus),
        "ram": max(0, new.memory_mb - old.memory_mb),
    }
    limits = await project_limits(conn, project_id, settings)
    _check(limits, await quotas.usage(conn, project_id), wanted)
    if user_id is None:
        return
    own = await quotas.user_limits(conn, project_id, user_id)
    if own.keys() & wanted.keys():
        _check({**limits, **own}, await quotas.user_usage(conn, project_id, user_id), wanted)


def check_metadata_items(limits: dict[str, int], count: int) -> None:
    """Raise :class:`OverQuota` if one server would have more metadata items than allowed."""
    limit = limits["metadata_items"]
    if _over(limit, 0, count):
        raise OverQuota(f"Maximum number of metadata items exceeds {limit}")


async def check_new_key_pair(
    conn: Connection, project_id: str, user_id: str, settings: QuotaSettings
) -> None:
    """Raise :class:`OverQuota` unless the user may have one more key pair.

    Call it inside the transaction that inserts the key pair: it takes the user's lock.
    """
    await key_pairs.lock_user(conn, user_id)
    limit = (await user_limits(conn, project_id, user_id, settings))["key_pairs"]
    if _over(limit, await key_pairs.count(conn, user_id), 1):
        raise OverQuota("Maximum number of key pairs exceeded")


async def check_new_server_group(
    conn: Connection, project_id: str, settings: QuotaSettings
) -> None:
    """Raise :class:`OverQuota` unless the project may have one more server group.

    Call it inside the transaction that inserts the group: it takes the project's lock.
    """
    await quotas.lock_project(conn, project_id)
    limit = (await project_limits(conn, project_id, settings))["server_groups"]
    if _over(limit, await server_groups.count(conn, project_id), 1):
        raise OverQuota("Quota exceeded, too many server groups.")


async def check_group_members(
    conn: Connection, project_id: str, settings: QuotaSettings, members: int, joining: int
) -> None:
    """Raise :class:`OverQuota` unless a group of ``members`` may take ``joining`` more.

    Call it after :func:`shared.db.server_groups.lock_group`, in the joining transaction.
    """
    limit = (await project_limits(conn, project_id, settings))["server_group_members"]
    if _over(limit, members, joining):
        raise OverQuota("Quota exceeded, too many servers in group")
