"""What a guest reads of itself: the config drive's files and the metadata service's answers.

Both say the same, in the layouts cloud-init and other first-boot tools read (Nova's):

* ``openstack/<version>/`` — ``meta_data.json`` (``uuid``, ``name``, ``hostname``,
  ``public_keys``, ``keys``, ``meta``, ``launch_index``, ``availability_zone``,
  ``project_id``, ``devices``), ``user_data`` (when the server has any: the bytes the
  user gave), ``network_data.json`` (links, networks with the static address, netmask
  and default route, services), ``vendor_data.json`` and ``vendor_data2.json`` (empty);
  each version of :data:`OPENSTACK_VERSIONS` and ``latest`` the same;
* ``ec2/<version>/`` — ``meta-data.json`` (the EC2 names: ``instance-id``,
  ``local-ipv4``, ``public-keys``...) and ``user-data`` on a config drive; over HTTP the
  same as a tree (``/<version>/meta-data/...``, ``/<version>/user-data``), as EC2 serves it.

The content comes from a :class:`GuestInfo`: the agent makes it from the build it was
sent (the config drive), keel-api from the database (the metadata service).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any
from uuid import UUID

from pydantic import Field

from shared import hostnames
from shared.objects.base import KeelModel
from shared.objects.network import FixedIp

#: The dated versions of the OpenStack layout (each answers like ``latest``).
OPENSTACK_VERSIONS = ("2012-08-10", "2013-04-04", "2013-10-17", "2015-10-15", "2016-06-30",
                      "2016-10-06", "2017-02-22", "2018-08-27", "2020-10-14")  # fmt: skip
#: The dated versions of the EC2 layout.
EC2_VERSIONS = ("1.0", "2007-01-19", "2007-03-01", "2007-08-29", "2007-10-10", "2007-12-15",
                "2008-02-01", "2008-09-01", "2009-04-04")  # fmt: skip
#: What the config drive carries of the EC2 layout (cloud-init reads ``latest``).
EC2_DRIVE_VERSIONS = ("2009-04-04", "latest")


class GuestInfo(KeelModel):
    """Everything a guest is told of itself."""

    uuid: UUID
    name: str
    project_id: str = ""
    availability_zone: str | None = None
    launch_index: int = 0
    flavor_name: str = ""
    key_name: str | None = None
    key_data: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    #: The user data as the user gave it: base64.
    user_data: str | None = None
    addresses: list[FixedIp] = Field(default_factory=list)
    #: The host name the server keeps (2.90); ``None`` for a server created before keel
    #: kept one, whose host name is made from its name.
    hostname: str | None = None


def signature(secret: str, instance_id: str) -> str:
    """The proof that a metadata request comes from the guest ``instance_id``: the HMAC
    (SHA-256, hex) of its id under the secret the agents and keel-api share."""
    return hmac.new(secret.encode(), instance_id.encode(), hashlib.sha256).hexdigest()


def hostname(name: str, instance_uuid: UUID) -> str:
    """The guest's host name from the server's name (:func:`shared.hostnames.from_name`)."""
    return hostnames.from_name(name, instance_uuid)


def guest_hostname(info: GuestInfo) -> str:
    """The host name the server keeps, or for an older server one made from its name."""
    return info.hostname or hostname(info.name, info.uuid)


def user_data_bytes(info: GuestInfo) -> bytes | None:
    if info.user_data is None:
        return None
    try:
        return base64.b64decode(info.user_data, validate=False)
    except (binascii.Error, ValueError):
        return None


def ec2_instance_id(instance_uuid: UUID) -> str:
    """An EC2-style id for the server (``i-`` and eight hex digits of its UUID)."""
    return f"i-{instance_uuid.hex[:8]}"


def meta_data(info: GuestInfo) -> dict[str, Any]:
    keys = []
    public_keys = {}
    if info.key_name is not None and info.key_data is not None:
        kind = "x509" if "BEGIN CERTIFICATE" in info.key_data else "ssh"
        keys.append({"name": info.key_name, "type": kind, "data": info.key_data})
        public_keys[info.key_name] = info.key_data
    return {
        "uuid": str(info.uuid),
        "meta": dict(info.metadata),
        "public_keys": public_keys,
        "keys": keys,
        "hostname": guest_hostname(info),
        "name": info.name,
        "launch_index": info.launch_index,
        "availability_zone": info.availability_zone,
        "project_id": info.project_id,
        "devices": [],
        "dedicated_cpus": [],
    }


def network_data(info: GuestInfo) -> dict[str, Any]:
    """The guest's links and static IPv4 configuration (its DHCP would offer the same)."""
    links, networks = [], []
    for index, fixed in enumerate(fixed for fixed in info.addresses if fixed.version == 4):
        link = f"tap{index}"
        links.append(
            {
                "id": link,
                "vif_id": str(fixed.network_id),
                "type": "phy",
                "mtu": 1500,
                "ethernet_mac_address": fixed.mac,
            }
        )
        entry: dict[str, Any] = {
            "id": f"network{index}",
            "type": "ipv4",
            "link": link,
            "ip_address": fixed.address,
        }
        interface = fixed.interface()
        if interface is not None:
            entry["netmask"] = str(interface.netmask)
            default = {"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": fixed.gateway()}
            entry["routes"] = [default]
        else:
            entry["netmask"] = "255.255.255.255"
            entry["routes"] = []
        entry["network_id"] = str(fixed.network_id)
        entry["services"] = []
        networks.append(entry)
    return {"links": links, "networks": networks, "services": []}


def ec2_meta_data(info: GuestInfo) -> dict[str, Any]:
    """The EC2 ``meta-data`` tree (nested dicts; leaves are text)."""
    name = guest_hostname(info)
    first = next((fixed.address for fixed in info.addresses if fixed.version == 4), "")
    tree: dict[str, Any] = {
        "ami-id": "ami-00000000",
        "ami-launch-index": str(info.launch_index),
        "ami-manifest-path": "FIXME",
        "block-device-mapping": {"ami": "vda", "root": "/dev/vda"},
        "hostname": name,
        "instance-action": "none",
        "instance-id": ec2_instance_id(info.uuid),
        "instance-type": info.flavor_name,
        "local-hostname": name,
        "local-ipv4": first,
        "placement": {"availability-zone": info.availability_zone or ""},
        "public-hostname": name,
        "public-ipv4": "",
        "reservation-id": "",
        "security-groups": "default",
    }
    if info.key_name is not None and info.key_data is not None:
        tree["public-keys"] = {"0": {"openssh-key": info.key_data, "_name": info.key_name}}
    return tree


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def openstack_files(info: GuestInfo, version: str) -> dict[str, bytes]:
    """The files of one version of the OpenStack layout, by name."""
    files = {"meta_data.json": _json(meta_data(info))}
    user_data = user_data_bytes(info)
    if user_data is not None:
        files["user_data"] = user_data
    index = OPENSTACK_VERSIONS.index(version) if version != "latest" else len(OPENSTACK_VERSIONS)
    if index >= OPENSTACK_VERSIONS.index("2013-10-17"):
        files["vendor_data.json"] = _json({})
    if index >= OPENSTACK_VERSIONS.index("2015-10-15"):
        files["network_data.json"] = _json(network_data(info))
    if index >= OPENSTACK_VERSIONS.index("2016-10-06"):
        files["vendor_data2.json"] = _json({})
    return files


def ec2_json(info: GuestInfo) -> dict[str, Any]:
    """The EC2 meta-data as the config drive's ``meta-data.json`` has it."""
    tree = ec2_meta_data(info)
    keys = tree.pop("public-keys", None)
    if keys is not None:
        key = keys["0"]
        tree["public-keys"] = {"0": {"openssh-key": key["openssh-key"]}}
    return tree


def config_drive_files(info: GuestInfo) -> dict[str, bytes]:
    """Every file of the config drive, by its path on the drive."""
    files: dict[str, bytes] = {}
    for version in (*OPENSTACK_VERSIONS, "latest"):
        for name, data in openstack_files(info, version).items():
            files[f"openstack/{version}/{name}"] = data
    user_data = user_data_bytes(info)
    for version in EC2_DRIVE_VERSIONS:
        files[f"ec2/{version}/meta-data.json"] = _json(ec2_json(info))
        if user_data is not None:
            files[f"ec2/{version}/user-data"] = user_data
    return files
