"""The server list's query string, read as Nova reads it.

Every filter Nova documents is honoured or refused with a 400; none is silently
dropped, except where Nova drops it too:

* Members may use only ``name``, ``status``, ``image``, ``flavor``, ``ip``,
  ``changes-since``, ``reservation_id`` and ``all_tenants`` (refused with 403), ``ip6``
  (2.5), ``tags``/``tags-any``/``not-tags``/``not-tags-any`` (2.26), ``changes-before``
  (2.66), ``locked`` (2.73) and, from 2.83, ``availability_zone``, ``config_drive``,
  ``key_name``, ``created_at``, ``launched_at``, ``terminated_at``, ``power_state``,
  ``task_state``, ``vm_state``, ``progress`` and ``user_id``, from 2.90 ``hostname``;
  Nova ignores their other filters, and so does keel.
* Admins may use every filter of :data:`EXACT` and :data:`REGEX` and ``deleted``; the
  joined-table filters (``metadata``, ``security_groups``...) and names starting with
  ``_`` are a 400. Names Nova does not know are ignored below 2.75 and a 400 from 2.75.

``sort_key``/``sort_dir`` are validated: an unknown key or direction is a 400; the keys
Nova accepts but ignores below 2.75 (``id``, ``vcpus``...) are ignored there (a 400 from
2.75), and ``host``/``node`` are ignored for members. ``changes-since``/``changes-before``
include deleted servers unless ``deleted`` says otherwise.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from starlette.datastructures import QueryParams

from services.api.http.faults import BadRequest, Forbidden
from services.api.http.microversion import APIVersion
from services.api.http.paging import MAX_LIMIT, PageRequest, marker_not_found, page_request
from services.api.http.query import boolean, refuse_unknown, timestamp
from services.api.servers.lookup import last_segment
from services.api.servers.views import STATUS_FILTERS, TASK_STATUS_FILTERS
from shared.context import RequestContext
from shared.db.instance_search import InstanceSearch, SortDir
from shared.objects.states import VmState

#: Filters matched exactly: query parameter → field.
EXACT = {
    "uuid": "uuid",
    "user_id": "user_id",
    "host": "host",
    "image": "image_ref",
    "image_ref": "image_ref",
    "flavor": "instance_type_id",
    "vm_state": "vm_state",
    "task_state": "task_state",
    "launch_index": "launch_index",
}
#: Filters that are POSIX regular expressions: query parameter → field.
REGEX = {
    "name": "display_name",
    "display_name": "display_name",
    "hostname": "hostname",
    "description": "display_description",
    "display_description": "display_description",
    "node": "node",
    "availability_zone": "availability_zone",
    "key_name": "key_name",
    "reservation_id": "reservation_id",
    "kernel_id": "kernel_id",
    "ramdisk_id": "ramdisk_id",
    "locked_by": "locked_by",
    "root_device_name": "root_device_name",
    "config_drive": "config_drive",
    "access_ip_v4": "access_ip_v4",
    "access_ip_v6": "access_ip_v6",
    "auto_disk_config": "auto_disk_config",
    "progress": "progress",
    "power_state": "power_state",
    "launched_at": "launched_at",
    "terminated_at": "terminated_at",
    "created_at": "created_at",
}
TAG_FILTERS = ("tags", "tags-any", "not-tags", "not-tags-any")
JOINED = frozenset(
    {
        "block_device_mapping",
        "services",
        "metadata",
        "system_metadata",
        "info_cache",
        "security_groups",
        "pci_devices",
    }
)
PAGING = frozenset({"sort_key", "sort_dir", "limit", "marker"})

SORT_KEYS = frozenset(
    {
        "access_ip_v4", "access_ip_v6", "auto_disk_config", "availability_zone",
        "config_drive", "created_at", "display_description", "display_name", "host",
        "hostname", "image_ref", "instance_type_id", "kernel_id", "key_name",
        "launch_index", "launched_at", "locked_by", "node", "power_state", "progress",
        "project_id", "ramdisk_id", "root_device_name", "task_state", "terminated_at",
        "updated_at", "user_id", "uuid", "vm_state",
    }
)  # fmt: skip
IGNORED_SORT_KEYS = frozenset(
    {
        "architecture", "cell_name", "cleaned", "default_ephemeral_device",
        "default_swap_device", "deleted", "deleted_at", "disable_terminate",
        "ephemeral_gb", "ephemeral_key_uuid", "id", "key_data", "launched_on", "locked",
        "memory_mb", "os_type", "reservation_id", "root_gb", "shutdown_terminate",
        "user_data", "vcpus", "vm_mode",
    }
)  # fmt: skip
ADMIN_SORT_KEYS = frozenset({"host", "node"})


#: Names Nova's list schema knows besides the filters above (some only to refuse them).
OTHER_KNOWN = frozenset(
    {"project_id", "tenant_id", "status", "all_tenants", "soft_deleted", "deleted", "ip", "ip6"}
)
OTHER_KNOWN_SINCE = {"changes-since": "2.1", "changes-before": "2.66", "locked": "2.73"}


def known_names(version: APIVersion) -> frozenset[str]:
    """Every query parameter of the server lists at ``version`` (2.75 refuses others)."""
    names = set(EXACT) | set(REGEX) | JOINED | PAGING | OTHER_KNOWN
    names |= {name for name, since in OTHER_KNOWN_SINCE.items() if version.at_least(since)}
    if version.at_least("2.26"):
        names.update(TAG_FILTERS)
    return frozenset(names)


#: The filters members may use from 2.83 on as well.
MEMBER_FILTERS_2_83 = frozenset(
    {
        "availability_zone", "config_drive", "key_name", "created_at", "launched_at",
        "terminated_at", "power_state", "task_state", "vm_state", "progress", "user_id",
    }
)  # fmt: skip


def member_filters(version: APIVersion) -> frozenset[str]:
    """The filters Nova lets a member use at ``version``."""
    allowed = {"reservation_id", "name", "status", "image", "flavor", "ip"}
    allowed |= {"changes-since", "all_tenants"}
    if version.at_least("2.5"):
        allowed.add("ip6")
    if version.at_least("2.26"):
        allowed.update(TAG_FILTERS)
    if version.at_least("2.66"):
        allowed.add("changes-before")
    if version.at_least("2.73"):
        allowed.add("locked")
    if version.at_least("2.83"):
        allowed |= MEMBER_FILTERS_2_83
    if version.at_least("2.90"):
        allowed.add("hostname")
    return frozenset(allowed)


def states_for(statuses: list[str], version: APIVersion) -> tuple[list[str], list[str] | None]:
    """The vm states and task states the ``status`` filters select.

    No vm state: the list is empty. Task states ``None``: not narrowed by task (no status
    asked for stands for a task, or one stands for a vm state whatever its task).
    """
    selected: list[str] = []
    tasks: list[str] | None = []
    for status in statuses:
        wanted = status.upper()
        states = STATUS_FILTERS.get(wanted)
        if states is None:
            if version.at_least("2.38"):
                raise BadRequest(f"Invalid status value {status!r}")
            continue
        selected.extend(state for state in states if state not in selected)
        if wanted in TASK_STATUS_FILTERS:
            if tasks is not None:
                tasks.extend(TASK_STATUS_FILTERS[wanted])
        elif states:
            tasks = None
    return selected, (tasks or None)


def _check_sort_keys(keys: list[str], dirs: list[str], version: APIVersion) -> frozenset[str]:
    """400 for an unknown key or direction; the keys to ignore at ``version``."""
    valid = SORT_KEYS | ({"locked"} if version.at_least("2.73") else set())
    # From 2.75 the keys Nova used to accept and ignore are refused like unknown ones.
    ignored = frozenset() if version.at_least("2.75") else IGNORED_SORT_KEYS - valid
    for key in keys:
        if key not in valid | ignored:
            raise BadRequest(
                f"Invalid input for query parameters sort_key. Value: {key}. '{key}' is not "
                f"one of the sort keys: {', '.join(sorted(valid))}."
            )
    for direction in dirs:
        if direction not in ("asc", "desc"):
            raise BadRequest("Unknown sort direction, must be 'desc' or 'asc'")
    return ignored


def sort_order(
    params: QueryParams, ctx: RequestContext, version: APIVersion
) -> list[tuple[str, SortDir]]:
    """``sort_key``/``sort_dir`` pairs as Nova pairs them; ``created_at`` breaks ties."""
    keys = [key.strip() for key in params.getlist("sort_key")] or ["created_at"]
    dirs = [direction.strip().lower() for direction in params.getlist("sort_dir")]
    ignored = _check_sort_keys(keys, dirs, version)
    for key in list(keys):
        if key in ignored:
            if len(dirs) > keys.index(key):
                dirs.pop(keys.index(key))
            keys.remove(key)
        elif key in ADMIN_SORT_KEYS and not ctx.is_admin:
            raise Forbidden(f"Only administrators can sort servers by {key}")
    if len(dirs) > len(keys):
        raise BadRequest("Sort direction size exceeds sort key size")
    default = dirs[0] if dirs else "desc"
    dirs += [default] * (len(keys) - len(dirs))
    if "created_at" not in keys:
        keys.append("created_at")
        dirs.append(default)
    return [
        (key, "asc" if direction == "asc" else "desc")
        for key, direction in zip(keys, dirs, strict=True)
    ]


def _given(params: QueryParams, ctx: RequestContext, version: APIVersion) -> dict[str, str]:
    """The filters the caller may use (the last value of each); 400 for forbidden names."""
    # Names starting with "_" pass Nova's schema, to be refused as filters below.
    refuse_unknown(
        (key for key in params.keys() if not key.startswith("_")), known_names(version), version
    )
    given = {key: params.getlist(key)[-1] for key in params.keys() if key not in PAGING}
    if not ctx.is_admin:
        allowed = member_filters(version)
        given = {key: value for key, value in given.items() if key in allowed}
    for key in given:
        if key in JOINED or key.startswith("_"):
            raise BadRequest(f"Invalid filter field: {key}.")
    return given


def _project(given: dict[str, str], ctx: RequestContext) -> str | None:
    """The project to list: the caller's, unless an admin asks for all (or one) projects."""
    if "all_tenants" not in given or not boolean("all_tenants", given["all_tenants"]):
        return ctx.project_id
    if not ctx.is_admin:
        raise Forbidden(
            "Policy doesn't allow listing servers of all projects: it needs the admin role."
        )
    return given.get("project_id") or given.get("tenant_id") or None


def _deleted(
    given: dict[str, str], vm_states: list[str] | None, ctx: RequestContext
) -> bool | None:
    if vm_states == [VmState.DELETED.value]:
        if not ctx.is_admin:
            raise Forbidden("Only administrators may list deleted instances")
        return True
    if "deleted" in given:
        return boolean("deleted", given["deleted"], strict=False)
    if "changes-since" in given or "changes-before" in given:
        return None
    return False


def _changes(given: dict[str, str], version: APIVersion) -> tuple[datetime | None, datetime | None]:
    since = timestamp("changes-since", given["changes-since"]) if "changes-since" in given else None
    before = None
    if "changes-before" in given and version.at_least("2.66"):
        before = timestamp("changes-before", given["changes-before"])
    if since is not None and before is not None and before < since:
        raise BadRequest("The value of changes-since must be less than or equal to changes-before.")
    return since, before


def _tags(given: dict[str, str], version: APIVersion) -> dict[str, list[str]]:
    if not version.at_least("2.26"):
        return {}
    return {
        name: [tag.strip() for tag in given[name].split(",") if tag.strip()]
        for name in TAG_FILTERS
        if name in given
    }


def _fields(given: dict[str, str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    exact: dict[str, list[str]] = {}
    for name, field in EXACT.items():
        if name in given:
            value = given[name]
            exact[field] = [
                last_segment(value) if name in ("image", "image_ref", "flavor") else value
            ]
    regex = {field: given[name] for name, field in REGEX.items() if name in given}
    return exact, regex


def _nothing(given: dict[str, str], version: APIVersion, vm_states: list[str] | None) -> bool:
    """True when a filter matches no server keel can have."""
    return "ip6" in given or vm_states == []


def _marker(paging: PageRequest) -> UUID | None:
    if paging.marker is None:
        return None
    try:
        return UUID(paging.marker)
    except ValueError:
        raise marker_not_found(paging.marker) from None


def server_search(
    params: QueryParams, ctx: RequestContext, version: APIVersion, *, max_limit: int = MAX_LIMIT
) -> tuple[InstanceSearch, PageRequest]:
    """The search a list request asks for, and its paging; 400/403 for what is refused."""
    given = _given(params, ctx, version)
    statuses = params.getlist("status") if "status" in given else []
    vm_states, task_states = states_for(statuses, version) if statuses else (None, None)
    exact, regex = _fields(given)
    if vm_states:
        exact["vm_state"] = vm_states
    if task_states:
        exact["task_state"] = task_states
    if version.at_least("2.73") and "locked" in given:
        exact["locked"] = [str(boolean("locked", given["locked"])).lower()]
    since, before = _changes(given, version)
    tags = _tags(given, version)
    paging = page_request(params.get("limit"), params.get("marker"), max_limit=max_limit)
    search = InstanceSearch(
        project_id=_project(given, ctx),
        exact=exact,
        regex=regex,
        deleted=_deleted(given, vm_states, ctx),
        soft_deleted=(
            boolean("soft_deleted", given["soft_deleted"], strict=False)
            if "soft_deleted" in given
            else None
        ),
        changes_since=since,
        changes_before=before,
        ip=given.get("ip"),
        tags=tags.get("tags", []),
        tags_any=tags.get("tags-any", []),
        not_tags=tags.get("not-tags", []),
        not_tags_any=tags.get("not-tags-any", []),
        nothing=_nothing(given, version, vm_states),
        sort=sort_order(params, ctx, version),
        marker=_marker(paging),
        limit=paging.limit,
    )
    return search, paging
