"""Networking API v2.0 bodies: keel's address pool as one shared external network, the
networks and subnets projects create, ports and security groups.

The configured network and its subnet come from the settings (``KEEL_NETWORK__*``); each
address a server holds is a port. Ids are stable: the network's is ``KEEL_NETWORK__ID``, the
subnet's and each port's are derived from it (and from the server and address).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from services.api.views.timestamps import isotime
from shared.config import NetworkSettings
from shared.db.fixed_ips import HeldAddress, usable_range
from shared.db.project_networks import ProjectNetwork
from shared.db.security_groups import DEFAULT, SecurityGroup, default_group, default_group_id
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


def port_view(held: HeldAddress, *, is_admin: bool, groups: Sequence[UUID] = ()) -> dict[str, Any]:
    """An address a server holds as a port, with the ids of the server's security groups
    (a server's groups are its ports' in Neutron)."""
    allocated = isotime(held.allocated_at) if held.allocated_at is not None else _EPOCH
    body: dict[str, Any] = {
        "id": str(port_id(held)),
        "name": "",
        "network_id": str(held.network_id),
        "mac_address": mac_address(held.network_id, held.address),
        "fixed_ips": [
            {
                "subnet_id": str(held.subnet_id or subnet_id(held.network_id)),
                "ip_address": held.address,
            }
        ],
        "device_id": str(held.instance_uuid),
        "device_owner": "compute:nova",
        "status": "ACTIVE",
        "admin_state_up": True,
        "security_groups": [str(group) for group in groups],
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


#: The one group every project has (others are created through the API).
DEFAULT_SECURITY_GROUP = DEFAULT


def security_group_id(project_id: str) -> UUID:
    """The id of ``project_id``'s default security group: stable, derived from the project."""
    return default_group_id(project_id)


def group_view(group: SecurityGroup) -> dict[str, Any]:
    """A security group in the Networking API's shape. keel filters no traffic: groups
    have no rules, and rules cannot be created (see docs/api.md)."""
    return {
        "id": str(group.id),
        "name": group.name,
        "security_group_rules": [],
        "stateful": True,
        "shared": False,
        "created_at": isotime(group.created_at),
        "updated_at": isotime(group.updated_at),
        **_common(group.project_id),
        "description": group.description,
    }


def security_group_view(project_id: str) -> dict[str, Any]:
    """The project's default group in the Networking API's shape."""
    return group_view(default_group(project_id))


def project_network_view(network: ProjectNetwork, *, is_admin: bool) -> dict[str, Any]:
    """A network a project created: its own, not shared, not external."""
    updated = network.updated_at or network.created_at
    body: dict[str, Any] = {
        "id": str(network.id),
        "name": network.name,
        "status": "ACTIVE",
        "admin_state_up": True,
        "shared": False,
        "router:external": False,
        "subnets": [] if network.subnet_id is None else [str(network.subnet_id)],
        "mtu": 1500,
        "availability_zones": [],
        "availability_zone_hints": [],
        "ipv4_address_scope": None,
        "ipv6_address_scope": None,
        "port_security_enabled": False,
        "l2_adjacency": True,
        "created_at": isotime(network.created_at),
        "updated_at": isotime(updated),
        **_common(network.project_id),
    }
    if is_admin:
        body.update(
            {
                "provider:network_type": "local",
                "provider:physical_network": None,
                "provider:segmentation_id": None,
            }
        )
    return body


def project_subnet_view(network: ProjectNetwork) -> dict[str, Any] | None:
    """The network's subnet; ``None`` when it has none."""
    if network.subnet_id is None or network.cidr is None:
        return None
    updated = network.updated_at or network.created_at
    return {
        "id": str(network.subnet_id),
        "name": network.subnet_name or "",
        "network_id": str(network.id),
        "ip_version": 4,
        "cidr": network.cidr,
        "gateway_ip": network.gateway_ip,
        "allocation_pools": [{"start": network.first_address, "end": network.last_address}],
        "enable_dhcp": True,
        "dns_nameservers": [],
        "host_routes": [],
        "service_types": [],
        "subnetpool_id": None,
        "ipv6_ra_mode": None,
        "ipv6_address_mode": None,
        "created_at": isotime(network.created_at),
        "updated_at": isotime(updated),
        **_common(network.project_id),
    }
