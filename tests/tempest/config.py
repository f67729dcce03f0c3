"""What Tempest is told about a keel cloud: its admin account and its ``tempest.conf``.

Tempest runs with dynamic credentials (``use_dynamic_credentials``), as against any
OpenStack cloud: with the one admin account :mod:`tests.tempest.run` creates before it
starts, it makes a project and users of its own for each test class through keel's
Identity API (projects, users, roles granted by name) and deletes them afterwards, so
every class is isolated from the others, tenant isolation included.

The feature flags say exactly what keel serves: a flag is true only where keel
implements the feature; what keel lacks is false, so Tempest skips those tests and says
why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The compute microversions keel-api answers.
MIN_MICROVERSION = "2.1"
MAX_MICROVERSION = "2.104"

#: Tempest's [compute-feature-enabled] flags for what keel serves and lacks.
FEATURES: dict[str, bool] = {
    "cold_migration": True,
    "resize": True,
    "pause": True,
    "suspend": True,
    "shelve": True,
    "shelve_migrate": False,
    "console_output": True,
    # changePassword needs an agent inside the guest to set it; keel's guests have none.
    "change_password": False,
    # OS-DCF:diskConfig is always MANUAL: keel never resizes a guest's partitions.
    "disk_config": False,
    "live_migration": True,
    "live_migrate_back_and_forth": True,
    "block_migration_for_live_migration": True,
    "volume_backed_live_migration": False,
    "can_migrate_between_any_hosts": True,
    "metadata_service": False,
    "vnc_console": False,
    "spice_console": False,
    "serial_console": False,
    "rescue": False,
    "stable_rescue": False,
    "enable_instance_password": True,
    "interface_attach": False,
    "snapshot": True,
    "personality": False,
    "attach_encrypted_volume": False,
    "config_drive": False,
    "swap_volume": False,
    "volume_multiattach": False,
    "unified_limits": False,
    "hostname_fqdn_sanitization": False,
}


@dataclass(frozen=True)
class Admin:
    """The one account made before Tempest starts: an admin, who makes every other."""

    username: str
    project: str
    password: str


@dataclass(frozen=True)
class Cloud:
    """What ``tempest.conf`` needs to know about the running cloud."""

    api_url: str
    image_ref: str
    image_ref_alt: str
    flavor_ref: str
    flavor_ref_alt: str
    compute_nodes: int
    network_name: str = "private"
    #: Guests Tempest can SSH into (the libvirt tier): the network of ``addresses`` whose
    #: address reaches a guest's port 22 (keel's SSH forwards); ``None``: no validation.
    network_for_ssh: str | None = None
    #: Features this cloud has beyond :data:`FEATURES` (its guests read config drives and
    #: the metadata service, say).
    features: tuple[tuple[str, bool], ...] = ()
    #: Seconds Tempest waits for a server to reach a status (real guests on a loaded
    #: machine: longer).
    build_timeout: int = 120


def validation(cloud: Cloud) -> str:
    """``[validation]``: Tempest SSHes into its servers as root with a generated key pair,
    at their address on ``network_for_ssh``; no security groups or floating IPs."""
    if cloud.network_for_ssh is None:
        return "run_validation = false"
    return f"""\
run_validation = true
connect_method = fixed
network_for_ssh = {cloud.network_for_ssh}
auth_method = keypair
image_ssh_user = root
ip_version_for_ssh = 4
security_group = false
security_group_rules = false
connect_timeout = 30
ssh_timeout = 180"""


def tempest_conf(cloud: Cloud, workdir: Path, admin: Admin) -> str:
    """The whole ``tempest.conf`` for ``cloud``; Tempest's state goes under ``workdir``."""
    flags = {**FEATURES, **dict(cloud.features)}
    features = "\n".join(f"{name} = {str(on).lower()}" for name, on in flags.items())
    return f"""\
[DEFAULT]
log_dir = {workdir}
log_file = tempest.log

[oslo_concurrency]
lock_path = {workdir / "locks"}

[auth]
use_dynamic_credentials = true
admin_username = {admin.username}
admin_password = {admin.password}
admin_project_name = {admin.project}
admin_domain_name = Default
default_credentials_domain_name = Default
create_isolated_networks = false

[identity]
uri_v3 = {cloud.api_url}/identity/v3
auth_version = v3
region = RegionOne
v3_endpoint_type = public
admin_role = admin
default_domain_id = default

[identity-feature-enabled]
api_v2 = false
api_v3 = true

[compute]
image_ref = {cloud.image_ref}
image_ref_alt = {cloud.image_ref_alt}
flavor_ref = {cloud.flavor_ref}
flavor_ref_alt = {cloud.flavor_ref_alt}
build_interval = 1
build_timeout = {cloud.build_timeout}
ready_wait = 0
min_compute_nodes = {cloud.compute_nodes}
min_microversion = {MIN_MICROVERSION}
max_microversion = {MAX_MICROVERSION}
region = RegionOne
endpoint_type = publicURL
fixed_network_name = {cloud.network_name}

[compute-feature-enabled]
{features}

[image]
region = RegionOne
endpoint_type = publicURL
build_interval = 1
build_timeout = 60

[image-feature-enabled]
api_v2 = true

[network]
region = RegionOne
endpoint_type = publicURL
project_networks_reachable = false
shared_physical_network = false

[network-feature-enabled]
floating_ips = false
api_extensions = external-net
ipv6 = false
port_admin_state_change = false
port_security = false

[validation]
{validation(cloud)}

[service_available]
nova = true
glance = true
neutron = true
cinder = false
swift = false
horizon = false
placement = false
"""
