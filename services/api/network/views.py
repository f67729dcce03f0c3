"""Networking API v2.0 bodies: keel's address pool as one shared external network.

The network and its subnet come from the settings (``KEEL_NETWORK__*``); each address a
server holds is a port. Ids are stable: the network's is ``KEEL_NETWORK__ID``, the
subnet's and each port's are derived from it (and from the server and address).
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from services.api.views.timestamps import isotime
from shared.config import NetworkSettings
from shared.db.fixed_ips import HeldAddress, usable_range
from shared.objects.network import mac_address

#: What every network resource shows as its age (keel keeps none for the pool itself).
_EPOCH = "1970-01-01T00:00:00Z"


def subnet_id(network_id: UUID) -> UUID:
    return uuid.uuid5(network_id, "subnet")


def port_id(held: HeldAddress) -> UUID:
    return uuid.uuid5(held.network_id, f"port {held.instance_uuid} {held.address}")


def _common(project_id: str) -> dict[str, Any]:
    return {
        "tenant_id": project_id,
        "project_id": project_id,
        "description": "",
        "tags": [],
        "revision_number": 0,
    }


def network_view(settings: NetworkSettings, *, is_admin: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(settings.network_id),
        "name": settings.name,
        "status": "ACTIVE",
        "admin_state_up": True,
        "shared": True,
        "router:external": True,
        "is_default": True,
        "subnets": [str(subnet_id(settings.network_id))],
        "mtu": 1500,
        "availability_zones": [],
        "availability_zone_hints": [],
        "ipv4_address_scope": None,
        "ipv6_address_scope": None,
        "port_security_enabled": False,
        "l2_adjacency": True,
        "created_at": _EPOCH,
        "updated_at": _EPOCH,
        **_common(""),
    }
    if is_admin:
        body.update(
            {
                "provider:network_type": "flat",
                "provider:physical_network": None,
                "provider:segmentation_id": None,
            }
        )
    return body


def subnet_view(settings: NetworkSettings) -> dict[str, Any]:
    first, last = usable_range(settings)
    network = settings.network
    return {
        "id": str(subnet_id(settings.network_id)),
        "name": settings.name,
        "network_id": str(settings.network_id),
        "ip_version": 4,
        "cidr": str(network),
        "gateway_ip": str(network.network_address + 1),
        "allocation_pools": [{"start": str(first), "end": str(last)}],
        "enable_dhcp": True,
        "dns_nameservers": [],
        "host_routes": [],
        "service_types": [],
        "subnetpool_id": None,
        "ipv6_ra_mode": None,
        "ipv6_address_mode": None,
        "created_at": _EPOCH,
        "updated_at": _EPOCH,
        **_common(""),
    }


def port_view(held: HeldAddress, *, is_admin: bool) -> dict[str, Any]:
    allocated = isotime(held.allocated_at) if held.allocated_at is not None else _EPOCH
    body: dict[str, Any] = {
        "id": str(port_id(held)),
        "name": "",
        "network_id": str(held.network_id),
        "mac_address": mac_address(held.network_id, held.address),
        "fixed_ips": [{"subnet_id": str(subnet_id(held.network_id)), "ip_address": held.address}],
        "device_id": str(held.instance_uuid),
        "device_owner": "compute:nova",
        "status": "ACTIVE",
        "admin_state_up": True,
        "security_groups": [],
        "allowed_address_pairs": [],
        "extra_dhcp_opts": [],
        "binding:vnic_type": "normal",
        "port_security_enabled": False,
        "created_at": allocated,
        "updated_at": allocated,
        **_common(held.project_id),
    }
    if is_admin:
        body["binding:host_id"] = held.host or ""
    return body


_SECURITY_GROUP_IDS = uuid.UUID("6b2f3c1e-9d0a-4c55-8a3e-2f1d7c9b0e41")
#: The one security group of every project: keel's guests have no firewall to configure.
DEFAULT_SECURITY_GROUP = "default"


def security_group_id(project_id: str) -> UUID:
    """The id of ``project_id``'s default security group: stable, derived from the project."""
    return uuid.uuid5(_SECURITY_GROUP_IDS, f"security-group {project_id} {DEFAULT_SECURITY_GROUP}")


def security_group_view(project_id: str) -> dict[str, Any]:
    """The project's default group in the Networking API's shape: no rules, nothing to
    filter, as keel's guests have no firewall."""
    return {
        "id": str(security_group_id(project_id)),
        "name": DEFAULT_SECURITY_GROUP,
        "security_group_rules": [],
        "stateful": True,
        "shared": False,
        "created_at": _EPOCH,
        "updated_at": _EPOCH,
        **_common(project_id),
        "description": "Default security group",
    }
