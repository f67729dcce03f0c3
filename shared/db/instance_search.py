"""Searching instances: the filters and sort keys of the compute API's server list.

:class:`InstanceSearch` says what to match; :func:`search` turns it into one query.
Field names are Nova's database names (``display_name``, ``instance_type_id``...), each
mapped in :data:`FIELDS` to a fixed SQL expression; values are always bound parameters.
Fields keel does not have (``kernel_id``, ``access_ip_v4``...) are the constant keel
shows for them, so filtering on them is honest: nothing carries a kernel id, so a
``kernel_id`` filter matches nothing. Sorting on a constant changes nothing and is
skipped.

Pages follow a marker instance by the sort keys themselves (keyset pagination, with
the row id as the final tie-breaker), so a page is stable whatever the sort.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from shared.db import placement
from shared.db.pool import Connection
from shared.exceptions import InstanceNotFound
from shared.objects.instance import Instance
from shared.objects.states import VmState

SortDir = Literal["asc", "desc"]


@dataclass(frozen=True)
class Column:
    """How one field reads in SQL: ``sql`` for filters (may be NULL); ``sort`` never NULL."""

    sql: str
    sort: str | None = None


def _iso(expr: str) -> str:
    """A timestamp as the API writes it (``2024-05-01T12:00:00.000000``), for regex filters."""
    return f"""to_char({expr} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')"""


#: A placed server's zone is its node's (found by id, see :mod:`shared.db.placement`).
_ZONE = (
    "COALESCE((SELECT n.availability_zone FROM compute_nodes n"
    f" WHERE n.id = {placement.node_id_sql('i')} AND n.deleted_at IS NULL),"
    " i.availability_zone)"
)
_UPDATED = "COALESCE(i.updated_at, i.created_at)"
_PROGRESS = "(CASE i.vm_state WHEN 'active' THEN 100 ELSE 0 END)"
_EPOCH = "timestamptz 'epoch'"
_NOTHING = "NULL::text"

#: Every field a filter or sort key may name.
FIELDS: Mapping[str, Column] = {
    "uuid": Column("i.uuid::text", "i.uuid"),
    "display_name": Column("i.display_name", "i.display_name"),
    # Servers created before keel kept host names have theirs made from their name.
    "hostname": Column(
        "COALESCE(i.hostname, i.display_name)", "COALESCE(i.hostname, i.display_name)"
    ),
    "display_description": Column("i.description", "COALESCE(i.description, '')"),
    "project_id": Column("i.project_id", "i.project_id"),
    "user_id": Column("i.user_id", "i.user_id"),
    "host": Column("i.host", "COALESCE(i.host, '')"),
    "node": Column("i.node", "COALESCE(i.node, '')"),
    "image_ref": Column("i.image_ref", "i.image_ref"),
    "instance_type_id": Column("i.flavor->>'flavorid'", "i.flavor->>'flavorid'"),
    "availability_zone": Column(_ZONE, f"COALESCE({_ZONE}, '')"),
    "vm_state": Column("i.vm_state", "i.vm_state"),
    "task_state": Column("i.task_state", "COALESCE(i.task_state, '')"),
    "power_state": Column("i.power_state::text", "i.power_state"),
    "progress": Column(f"{_PROGRESS}::text", _PROGRESS),
    "created_at": Column(_iso("i.created_at"), "i.created_at"),
    "updated_at": Column(_iso(_UPDATED), _UPDATED),
    "launched_at": Column(_iso("i.launched_at"), f"COALESCE(i.launched_at, {_EPOCH})"),
    "terminated_at": Column(_iso("i.terminated_at"), f"COALESCE(i.terminated_at, {_EPOCH})"),
    "key_name": Column(_NOTHING),
    "reservation_id": Column("COALESCE(i.reservation_id, '')", "COALESCE(i.reservation_id, '')"),
    "kernel_id": Column("''::text"),
    "ramdisk_id": Column("''::text"),
    "launch_index": Column("i.launch_index::text", "i.launch_index"),
    "config_drive": Column("''::text"),
    "auto_disk_config": Column("'false'::text"),
    "locked": Column("(i.locked_by IS NOT NULL)::text", "(i.locked_by IS NOT NULL)"),
    "access_ip_v4": Column("i.access_ip_v4", "COALESCE(i.access_ip_v4, '')"),
    "access_ip_v6": Column("i.access_ip_v6", "COALESCE(i.access_ip_v6, '')"),
    "locked_by": Column("i.locked_by", "COALESCE(i.locked_by, '')"),
    "root_device_name": Column(_NOTHING),
}


@dataclass(frozen=True)
class InstanceSearch:
    """What a server list asks for. Empty fields do not filter."""

    #: Only this project's instances; ``None`` for every project.
    project_id: str | None = None
    #: field → values; an instance matches if the field equals any of them.
    exact: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: field → POSIX regular expression the field must match.
    regex: Mapping[str, str] = field(default_factory=dict)
    #: False: live instances only; True: deleted ones only; None: both.
    deleted: bool | None = False
    #: Whether soft-deleted servers (live rows in SOFT_DELETED) count as deleted ones, as
    #: in Nova: ``None`` (the default) leaves them out of the live and into the deleted;
    #: True shows them among the live too, False leaves them out of the deleted too.
    soft_deleted: bool | None = None
    #: Changed (updated, or created if never updated) at or after / at or before.
    changes_since: datetime | None = None
    changes_before: datetime | None = None
    #: A regular expression an IPv4 address of the instance must match from its start.
    ip: str | None = None
    #: Tags: all of ``tags``, any of ``tags_any``, not all of ``not_tags``, none of
    #: ``not_tags_any``.
    tags: Sequence[str] = ()
    tags_any: Sequence[str] = ()
    not_tags: Sequence[str] = ()
    not_tags_any: Sequence[str] = ()
    #: True when a filter can match nothing (an IPv6 address...).
    nothing: bool = False
    sort: Sequence[tuple[str, SortDir]] = (("created_at", "desc"),)
    marker: UUID | None = None
    limit: int | None = None


class _Query:
    """SQL text and its bound arguments, built together."""

    def __init__(self) -> None:
        self.args: list[Any] = []
        self.where: list[str] = []

    def bind(self, value: Any) -> str:
        self.args.append(value)
        return f"${len(self.args)}"


def _filters(search: InstanceSearch, query: _Query) -> None:
    where, bind = query.where, query.bind
    if search.nothing:
        where.append("false")
    if search.project_id is not None:
        where.append(f"i.project_id = {bind(search.project_id)}")
    if search.deleted is False:
        where.append("i.deleted_at IS NULL")
        if not search.soft_deleted:
            where.append(f"i.vm_state <> {bind(VmState.SOFT_DELETED.value)}")
    elif search.deleted is True:
        if search.soft_deleted is False:
            where.append("i.deleted_at IS NOT NULL")
        else:
            soft = bind(VmState.SOFT_DELETED.value)
            where.append(f"(i.deleted_at IS NOT NULL OR i.vm_state = {soft})")
    for name, values in search.exact.items():
        where.append(f"{FIELDS[name].sql} = ANY({bind(list(values))}::text[])")
    for name, pattern in search.regex.items():
        where.append(f"{FIELDS[name].sql} ~ {bind(pattern)}::text")
    if search.changes_since is not None:
        where.append(f"{_UPDATED} >= {bind(search.changes_since)}::timestamptz")
    if search.changes_before is not None:
        where.append(f"{_UPDATED} <= {bind(search.changes_before)}::timestamptz")
    if search.ip is not None:
        where.append(
            "EXISTS (SELECT 1 FROM fixed_ips f WHERE f.instance_uuid = i.uuid"
            f" AND host(f.address) ~ ('^(?:' || {bind(search.ip)}::text || ')'))"
        )
    for tags, test in (
        (search.tags, "i.tags @> {}"),
        (search.tags_any, "i.tags && {}"),
        (search.not_tags, "NOT (i.tags @> {})"),
        (search.not_tags_any, "NOT (i.tags && {})"),
    ):
        if tags:
            where.append(test.format(f"{bind(list(tags))}::text[]"))


def _order(search: InstanceSearch) -> list[tuple[str, SortDir]]:
    keys: list[tuple[str, SortDir]] = []
    for name, direction in search.sort:
        sort = FIELDS[name].sort
        if sort is not None and all(sort != expr for expr, _ in keys):
            keys.append((sort, direction))
    last: SortDir = search.sort[0][1] if search.sort else "desc"
    keys.append(("i.id", last))
    return keys


async def _after_marker(
    conn: Connection, marker: UUID, keys: list[tuple[str, SortDir]], query: _Query
) -> None:
    """Keep only instances after the marker in this order; the marker may be deleted."""
    columns = ", ".join(f"{expr} AS k{n}" for n, (expr, _) in enumerate(keys))
    row = await conn.fetchrow(f"SELECT {columns} FROM instances i WHERE i.uuid = $1", marker)
    if row is None:
        raise InstanceNotFound(f"marker [{marker}] not found")
    alternatives = []
    for n, (expr, direction) in enumerate(keys):
        equal = [f"{keys[m][0]} = {query.bind(row[f'k{m}'])}" for m in range(n)]
        beyond = f"{expr} {'>' if direction == 'asc' else '<'} {query.bind(row[f'k{n}'])}"
        alternatives.append("(" + " AND ".join([*equal, beyond]) + ")")
    query.where.append("(" + " OR ".join(alternatives) + ")")


async def search(conn: Connection, search: InstanceSearch) -> list[Instance]:
    """The instances ``search`` selects, in its order, after its marker, at most its limit.

    Raises :class:`InstanceNotFound` for a marker that never existed and lets
    ``asyncpg.InvalidRegularExpressionError`` through for a bad pattern.
    """
    query = _Query()
    _filters(search, query)
    keys = _order(search)
    if search.marker is not None:
        await _after_marker(conn, search.marker, keys, query)
    where = " AND ".join(query.where) or "true"
    order = ", ".join(f"{expr} {direction.upper()}" for expr, direction in keys)
    limit = query.bind(search.limit)
    rows = await conn.fetch(
        f"SELECT i.* FROM instances i WHERE {where} ORDER BY {order} LIMIT {limit}",
        *query.args,
    )
    return [Instance.from_row(row) for row in rows]
