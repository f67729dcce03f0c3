"""Server bodies: the summary of a list, the detail at a microversion, the create answer.

What the client reads most: ``status`` (from the vm state), ``image`` (an object, or
``""`` for none, never null; from 2.98 with the image ``properties`` the server kept)
and ``flavor`` (``{"id", "links"}`` below 2.47, the embedded flavor from 2.47). From 2.96
servers show the zone their create pinned them to, from 2.100 its scheduler hints.
Fields an admin sees and a member does not: the ``OS-EXT-SRV-ATTR:*`` placement details
(but the host name, everyone's from 2.90), ``host_status`` (from 2.16) and the details
of a 500 fault.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.views.timestamps import isotime, naive_isotime
from shared.db.request_specs import Asked
from shared.objects.instance import Instance
from shared.objects.network import FixedIp
from shared.objects.states import TaskState, VmState

_STATUS: dict[str, str] = {
    VmState.BUILDING: "BUILD",
    VmState.ACTIVE: "ACTIVE",
    VmState.STOPPED: "SHUTOFF",
    VmState.RESIZED: "VERIFY_RESIZE",
    VmState.PAUSED: "PAUSED",
    VmState.SUSPENDED: "SUSPENDED",
    VmState.ERROR: "ERROR",
    VmState.SOFT_DELETED: "SOFT_DELETED",
    VmState.SHELVED: "SHELVED",
    VmState.SHELVED_OFFLOADED: "SHELVED_OFFLOADED",
    VmState.DELETED: "DELETED",
}

#: Task states that show instead of an active server's status, as Nova shows them.
_TASK_STATUS: dict[str, str] = {
    TaskState.REBOOTING: "REBOOT",
    TaskState.REBOOTING_HARD: "HARD_REBOOT",
    TaskState.REBUILDING: "REBUILD",
    TaskState.REBUILD_SPAWNING: "REBUILD",
    TaskState.RESIZE_PREP: "RESIZE",
    TaskState.RESIZE_MIGRATING: "RESIZE",
    TaskState.RESIZE_REVERTING: "REVERT_RESIZE",
    TaskState.MIGRATING: "MIGRATING",
}
#: The vm states whose status a running task replaces.
_TASK_SHOWN = (VmState.ACTIVE, VmState.STOPPED, VmState.ERROR, VmState.RESIZED)


#: Status filters a client may send, and the vm states they select here. Statuses keel
#: never produces are valid filters that match nothing.
STATUS_FILTERS: dict[str, tuple[str, ...]] = {
    **{status: (vm_state,) for vm_state, status in _STATUS.items()},
    **{status: tuple(_TASK_SHOWN) for status in _TASK_STATUS.values()},
    **{
        status: ()
        for status in (
            "PASSWORD",
            "RESCUE",
            "UNKNOWN",
        )
    },
}
#: Status filters that stand for a task, and the task states each selects. As in Nova,
#: a status that stands for a vm state alone (``ACTIVE``) selects that vm state whatever
#: its task, so a list asking for it too is not narrowed by task.
TASK_STATUS_FILTERS: dict[str, tuple[str, ...]] = {
    status: tuple(task for task, shown in _TASK_STATUS.items() if shown == status)
    for status in set(_TASK_STATUS.values())
}

_PROGRESS = {"BUILD": 0, "ACTIVE": 100}


def server_status(vm_state: str, task_state: str | None = None) -> str:
    if vm_state in _TASK_SHOWN and task_state in _TASK_STATUS:
        return _TASK_STATUS[task_state]
    return _STATUS.get(vm_state, "UNKNOWN")


def host_id(project_id: str, host: str | None) -> str:
    """An opaque id of the host, the same for one project's servers on one host."""
    if not host:
        return ""
    return hashlib.sha224((project_id + host).encode()).hexdigest()


def instance_name(instance: Instance) -> str:
    return f"instance-{instance.id:08x}"


def created_body(
    instance: Instance, links: Links, admin_pass: str, groups: Sequence[str] | None = None
) -> dict[str, Any]:
    """The answer to a create: enough to find the new server, its security groups (the
    ones asked for, else ``default``) and its admin password."""
    names = ["default"] if groups is None else list(groups)
    return {
        "id": str(instance.uuid),
        "links": links.resource("servers", str(instance.uuid)),
        "OS-DCF:diskConfig": "MANUAL",
        "security_groups": [{"name": name} for name in names],
        "adminPass": admin_pass,
    }


def addresses_body(
    held: Sequence[FixedIp], *, extended: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """``{network name: [address, ...]}`` as the ``addresses`` of a server.

    ``extended``: with the ``OS-EXT-IPS`` type and MAC address, as every view but the
    answer to an update below 2.75 shows them.
    """
    body: dict[str, list[dict[str, Any]]] = {}
    for fixed in held:
        entry: dict[str, Any] = {"version": fixed.version, "addr": fixed.address}
        if extended:
            entry["OS-EXT-IPS:type"] = "fixed"
            entry["OS-EXT-IPS-MAC:mac_addr"] = fixed.mac
        body.setdefault(fixed.network_name, []).append(entry)
    return body


#: What Nova's answer to ``PUT /servers/{id}`` leaves out below 2.75 (from 2.75 it shows
#: all of the server).
_NOT_IN_UPDATE = (
    "key_name",
    "config_drive",
    "OS-EXT-AZ:availability_zone",
    "OS-EXT-STS:vm_state",
    "OS-EXT-STS:task_state",
    "OS-EXT-STS:power_state",
    "OS-SRV-USG:launched_at",
    "OS-SRV-USG:terminated_at",
    "security_groups",
    "os-extended-volumes:volumes_attached",
)


@dataclass(frozen=True)
class ServerView:
    """Shapes servers for one request: its microversion, links and caller."""

    version: APIVersion
    links: Links
    is_admin: bool
    #: compute host → ``UP``/``DOWN``/``MAINTENANCE``/``UNKNOWN``, for ``host_status``.
    host_statuses: Mapping[str, str] = field(default_factory=dict)
    #: (host, node) → the node's availability zone, shown for servers placed there.
    node_zones: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: instance → the fixed addresses it holds.
    addresses: Mapping[UUID, Sequence[FixedIp]] = field(default_factory=dict)
    #: instance → the names of the security groups it is in; a server missing here is
    #: shown in its project's ``default`` group.
    security_groups: Mapping[UUID, Sequence[str]] = field(default_factory=dict)
    #: instance → the server group it is in (read for 2.71 and later only).
    groups: Mapping[UUID, UUID] = field(default_factory=dict)
    #: instance → what its create asked for: the zone it is pinned to and its scheduler
    #: hints (read for 2.96 and later only).
    asked: Mapping[UUID, Asked] = field(default_factory=dict)

    def availability_zone(self, instance: Instance) -> str:
        """The zone of the node the server is on; before that, the zone it asked for."""
        if instance.host:
            zone = self.node_zones.get((instance.host, instance.node or ""))
            if zone is not None:
                return zone
        return instance.availability_zone or ""

    def summary(self, instance: Instance) -> dict[str, Any]:
        uuid = str(instance.uuid)
        return {
            "id": uuid,
            "name": instance.display_name,
            "links": self.links.resource("servers", uuid),
        }

    def image(self, instance: Instance) -> dict[str, Any] | str:
        if not instance.image_ref:
            return ""
        ref = instance.image_ref
        image: dict[str, Any] = {
            "id": ref,
            "links": [{"rel": "bookmark", "href": self.links.bookmark("images", ref)}],
        }
        if self.version.at_least("2.98"):
            image["properties"] = dict(instance.image_properties)
        return image

    def flavor(self, instance: Instance) -> dict[str, Any]:
        flavor = instance.flavor
        if not self.version.at_least("2.47"):
            href = self.links.bookmark("flavors", flavor.flavorid)
            return {"id": flavor.flavorid, "links": [{"rel": "bookmark", "href": href}]}
        return {
            "vcpus": flavor.vcpus,
            "ram": flavor.memory_mb,
            "disk": flavor.root_gb,
            "ephemeral": flavor.ephemeral_gb,
            "swap": flavor.swap,
            "original_name": flavor.name,
            "extra_specs": dict(flavor.extra_specs),
        }

    def fault(self, instance: Instance) -> dict[str, Any] | None:
        fault = instance.fault
        if fault is None or instance.vm_state not in (VmState.ERROR, VmState.DELETED):
            return None
        body: dict[str, Any] = {
            "code": fault.code,
            "created": isotime(fault.created),
            "message": fault.message,
        }
        if self.is_admin or fault.code != 500:
            body["details"] = fault.details
        return body

    def detail(self, instance: Instance, *, show: bool = False) -> dict[str, Any]:
        """The full server at this request's microversion (``show``: a single server)."""
        body = self._base(instance)
        fault = self.fault(instance)
        if fault is not None:
            body["fault"] = fault
        if body["status"] in _PROGRESS:
            body["progress"] = _PROGRESS[body["status"]]
        if self.is_admin:
            body.update(self._admin_fields(instance))
        elif self.version.at_least("2.90"):
            # From 2.90 everyone sees the host name, not only admins.
            body["OS-EXT-SRV-ATTR:hostname"] = instance.guest_hostname
        body.update(self._versioned_fields(instance, show=show))
        return body

    def changed(self, instance: Instance) -> dict[str, Any]:
        """The answer to ``PUT /servers/{id}`` (and to a rebuild) at this microversion.

        Below 2.75 it is the update view (:meth:`updated`); from 2.75 the server is shown
        whole, exactly as ``GET /servers/{id}`` shows it, so a client reads one shape.
        """
        if self.version.at_least("2.75"):
            return self.detail(instance, show=True)
        return self.updated(instance)

    def updated(self, instance: Instance) -> dict[str, Any]:
        """The answer to ``PUT /servers/{id}`` below 2.75: the base view, without the
        extended attributes (no ``OS-EXT-*`` keys, no admin fields)."""
        body = self._base(instance)
        for name in _NOT_IN_UPDATE:
            body.pop(name, None)
        body["addresses"] = addresses_body(self.addresses.get(instance.uuid, ()), extended=False)
        fault = self.fault(instance)
        if fault is not None:
            body["fault"] = fault
        if body["status"] in _PROGRESS:
            body["progress"] = _PROGRESS[body["status"]]
        body.update(self._versioned_fields(instance, show=True))
        return body

    def rebuilt(self, instance: Instance) -> dict[str, Any]:
        """The answer to a rebuild (without its ``adminPass``): below 2.75 the update view
        with the key pair's name (2.54); from 2.75 the server as a show answers it, but
        for the admin's ``OS-EXT-SRV-ATTR:user_data`` (as in Nova); from 2.57 the user
        data as ``user_data``."""
        body = self.changed(instance)
        if self.version.at_least("2.75"):
            body.pop("OS-EXT-SRV-ATTR:user_data", None)
        elif self.version.at_least("2.54"):
            body["key_name"] = instance.key_name
        if self.version.at_least("2.57"):
            body["user_data"] = instance.user_data
        return body

    def _base(self, instance: Instance) -> dict[str, Any]:
        """The fields every view shows; ``security_groups`` only when the server is in
        one, as Nova leaves the key out for a server in none."""
        body = self._fields(instance)
        if not body["security_groups"]:
            del body["security_groups"]
        return body

    def _fields(self, instance: Instance) -> dict[str, Any]:
        return {
            **self.summary(instance),
            "status": server_status(instance.vm_state, instance.task_state),
            "tenant_id": instance.project_id,
            "user_id": instance.user_id,
            "metadata": dict(instance.metadata),
            "hostId": host_id(instance.project_id, instance.host),
            "image": self.image(instance),
            "flavor": self.flavor(instance),
            "created": isotime(instance.created_at),
            "updated": isotime(instance.updated_at or instance.created_at),
            "addresses": addresses_body(self.addresses.get(instance.uuid, ())),
            "accessIPv4": instance.access_ip_v4 or "",
            "accessIPv6": instance.access_ip_v6 or "",
            "key_name": instance.key_name,
            "config_drive": "True" if instance.config_drive else "",
            "OS-DCF:diskConfig": "MANUAL",
            "OS-EXT-AZ:availability_zone": self.availability_zone(instance),
            "OS-EXT-STS:vm_state": instance.vm_state,
            "OS-EXT-STS:task_state": instance.task_state,
            "OS-EXT-STS:power_state": instance.power_state,
            "OS-SRV-USG:launched_at": naive_isotime(instance.launched_at),
            "OS-SRV-USG:terminated_at": naive_isotime(instance.terminated_at),
            "security_groups": [
                {"name": name} for name in self.security_groups.get(instance.uuid, ["default"])
            ],
            "os-extended-volumes:volumes_attached": [],
        }

    def _admin_fields(self, instance: Instance) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "OS-EXT-SRV-ATTR:host": instance.host,
            "OS-EXT-SRV-ATTR:hypervisor_hostname": instance.node,
            "OS-EXT-SRV-ATTR:instance_name": instance_name(instance),
        }
        if self.version.at_least("2.3"):
            fields.update(
                {
                    "OS-EXT-SRV-ATTR:reservation_id": instance.reservation_id or "",
                    "OS-EXT-SRV-ATTR:launch_index": instance.launch_index,
                    "OS-EXT-SRV-ATTR:hostname": instance.guest_hostname,
                    "OS-EXT-SRV-ATTR:kernel_id": "",
                    "OS-EXT-SRV-ATTR:ramdisk_id": "",
                    "OS-EXT-SRV-ATTR:root_device_name": None,
                    "OS-EXT-SRV-ATTR:user_data": instance.user_data,
                }
            )
        if self.version.at_least("2.16"):
            fields["host_status"] = (
                self.host_statuses.get(instance.host, "UNKNOWN") if instance.host else ""
            )
        return fields

    def _versioned_fields(self, instance: Instance, *, show: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.version.at_least("2.9"):
            fields["locked"] = instance.locked_by is not None
        if self.version.at_least("2.19"):
            fields["description"] = instance.description
        if self.version.at_least("2.26"):
            fields["tags"] = list(instance.tags)
        if self.version.at_least("2.63"):
            fields["trusted_image_certificates"] = None
        if show and self.version.at_least("2.71"):
            group = self.groups.get(instance.uuid)
            fields["server_groups"] = [] if group is None else [str(group)]
        if self.version.at_least("2.73"):
            fields["locked_reason"] = instance.locked_reason
        asked = self.asked.get(instance.uuid)
        if self.version.at_least("2.96"):
            fields["pinned_availability_zone"] = None if asked is None else asked.zone
        if self.version.at_least("2.100"):
            fields["scheduler_hints"] = {} if asked is None else dict(asked.scheduler_hints)
        return fields
