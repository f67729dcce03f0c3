"""Settings for every keel process.

Values come, highest precedence first, from environment variables prefixed ``KEEL_``
(nested groups joined with ``__``, e.g. ``KEEL_COMPUTE__VCPUS=8``), then from an optional
TOML file given as ``--config FILE``, then from the defaults below. A bad value stops the
process with one line naming the setting (see :func:`load_settings`).
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import tomllib
import uuid
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from shared.exceptions import ConfigError
from shared.faults import POINTS
from shared.rpc.broker_url import node_urls
from shared.versions import SERVICE_VERSION, parse_version, release_number

ENV_PREFIX = "KEEL_"
ENV_NESTED_DELIMITER = "__"


#: RabbitMQ's own heartbeat, used when neither keel nor the URL sets one.
BROKER_DEFAULT_HEARTBEAT = 60
#: Seconds one attempt to connect to a broker node may take (shared.rpc.amqp_connection).
BROKER_ATTEMPT_TIMEOUT = 10.0


def url_heartbeat(url: str) -> int | None:
    """The ``heartbeat`` a transport URL's query sets, if any."""
    for pair in url.partition("?")[2].split("&"):
        key, _, value = pair.partition("=")
        if key == "heartbeat" and value.isdigit():
            return int(value)
    return None


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenInfo(_Group):
    """Who a static API token authenticates as."""

    user_id: str
    project_id: str
    roles: list[str] = Field(default_factory=lambda: ["member"])


class AuthSettings(_Group):
    #: token → identity. Empty means every API request is refused with 401.
    tokens: dict[str, TokenInfo] = Field(default_factory=dict)


class RpcSettings(_Group):
    #: Seconds a ``call`` waits for its reply.
    call_timeout: float = Field(default=60.0, gt=0)
    #: Messages a consumer may hold unacknowledged at once.
    prefetch: int = Field(default=16, ge=1, le=1000)
    #: Seconds an unused queue lives on the broker; unset keeps queues until deleted.
    queue_expires: float | None = Field(default=None, gt=0)
    #: Seconds to keep retrying the first connection to the broker.
    connect_timeout: float = Field(default=60.0, gt=0)
    #: Deliveries of a message after the first before RabbitMQ dead-letters it (quorum
    #: queues' ``x-delivery-limit``).
    delivery_limit: int = Field(default=5, ge=1, le=1000)
    #: Seconds a handler meeting transient failures is retried within one delivery before
    #: its message is returned to the queue.
    handler_retry_timeout: float = Field(default=10.0, gt=0)
    #: Replicas of a topic's quorum queue when it is created (RabbitMQ's
    #: ``x-quorum-initial-group-size``; it places ``min(this, cluster nodes)``).
    quorum_group_size: int = Field(default=3, ge=1, le=255)
    #: Seconds between AMQP heartbeats: a connection whose node stops answering (frozen,
    #: or cut) is dropped after about three times this and the next node tried. A
    #: ``?heartbeat=`` in the transport URL wins; 0 takes the broker's (RabbitMQ: 60 s,
    #: noticed only after three minutes — longer than a host fence's lease).
    heartbeat: int = Field(default=10, ge=0, le=600)
    #: RabbitMQ's management API, for ``keel-manage agent``; unset, port 15672 of the
    #: transport URL's first host, as the transport URL's user.
    management_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")


class DatabaseSettings(_Group):
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    #: Seconds to keep retrying the first connection to the database.
    connect_timeout: float = Field(default=60.0, gt=0)
    #: Seconds to wait for a pooled connection (connecting a new one included).
    acquire_timeout: float = Field(default=10.0, gt=0)
    #: Seconds one SQL command may take before it fails.
    command_timeout: float = Field(default=30.0, gt=0)


class ApiSettings(_Group):
    #: The most items one page of a list holds, whatever ``limit`` asks (Nova's
    #: ``max_limit``); a list without ``limit`` is cut there too, with a next link.
    max_limit: int = Field(default=1000, ge=1, le=100_000)
    #: Largest request body keel-api reads; a larger one is refused with 413.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    #: Who may read the OpenAPI document at ``/openapi.json``.
    openapi: Literal["admin", "public", "off"] = "admin"
    #: A YAML file of policy rules overriding keel's defaults (docs/api.md, "Policies").
    policy_file: Path | None = None


class MetadataSettings(_Group):
    """The metadata service (keel-api) and the agents that pass guests' requests to it."""

    #: keel-api: ``HOST:PORT`` to serve the metadata service on; unset, it is not served.
    bind: str | None = None
    #: Agents: the metadata service's URL (``http://HOST:PORT``) as they reach it; unset,
    #: guests have no metadata service (a config drive still works).
    url: str | None = Field(default=None, pattern=r"^http://[^/]+$")
    #: The secret keel-api and the agents share: an agent signs the id of the guest a
    #: request comes from (HMAC-SHA256), and keel-api answers only signed requests.
    secret: str | None = Field(default=None, min_length=16, repr=False)

    @field_validator("bind")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:8775")
        return value

    @model_validator(mode="after")
    def _secret_given(self) -> MetadataSettings:
        if (self.bind is not None or self.url is not None) and self.secret is None:
            raise ValueError("the metadata service needs KEEL_METADATA__SECRET")
        return self

    @property
    def listen(self) -> tuple[str, int] | None:
        if self.bind is None:
            return None
        host, _, port = self.bind.rpartition(":")
        return host, int(port)


class SchedulerSettings(_Group):
    #: The first host a request tries is picked at random among this many of the best
    #: (Nova's ``host_subset_size``), so concurrent requests do not all race for one host.
    host_subset_size: int = Field(default=8, ge=1, le=1000)


class ComputeSettings(_Group):
    #: ``local`` keeps each guest as a directory in the state dir; ``fake`` keeps it in
    #: memory; ``libvirt`` runs real virtual machines (``KEEL_LIBVIRT__*``).
    driver: Literal["local", "fake", "libvirt"] = "local"
    #: Most GiB of base images an agent keeps in its image cache (least recently used
    #: go first).
    image_cache_gb: float = Field(default=10.0, gt=0)
    #: Resources the agent reports; unset means measured on this machine.
    vcpus: int | None = Field(default=None, ge=1)
    memory_mb: int | None = Field(default=None, ge=1)
    local_gb: int | None = Field(default=None, ge=1)
    cpu_allocation_ratio: float = Field(default=4.0, gt=0)
    ram_allocation_ratio: float = Field(default=1.0, gt=0)
    disk_allocation_ratio: float = Field(default=1.0, gt=0)
    availability_zone: str = "nova"
    #: The name the agent reports for its hypervisor; unset, the agent's host name. It may
    #: change while the node keeps its identity (the new name is recorded and logged).
    hypervisor_hostname: str | None = Field(default=None, min_length=1, max_length=255)
    #: Seconds SIGTERM waits for in-flight work before the agent exits anyway.
    drain_timeout: float = Field(default=60.0, gt=0)
    #: Seconds between an agent's reports of its guests (evacuations to confirm,
    #: deleted instances to remove, orphans to record); it also reports at start-up.
    reconcile_interval: float = Field(default=60.0, gt=0)
    #: Seconds the simulated memory copy of a live migration takes on the ``local`` and
    #: ``fake`` drivers (progress is reported four times a second).
    live_migration_seconds: float = Field(default=2.0, ge=0, le=3600)


class LibvirtSettings(_Group):
    """The libvirt driver's settings (``KEEL_COMPUTE__DRIVER=libvirt``)."""

    #: The libvirt connection URI.
    uri: str = Field(default="qemu:///system", min_length=1)
    #: ``kvm`` (hardware virtualisation), ``qemu`` (software emulation), or ``auto``:
    #: ``kvm`` when ``/dev/kvm`` works and libvirt offers it, else ``qemu``.
    domain_type: Literal["auto", "kvm", "qemu"] = "auto"
    #: Seconds a clean shutdown (stop, soft reboot, migration) waits for the guest before
    #: it is powered off by force.
    shutdown_timeout: float = Field(default=60.0, gt=0)
    #: How guests are connected: ``user`` (QEMU user-mode networking, one private network
    #: per guest: no bridge or root needed; the guest's SSH is forwarded from a loopback
    #: address) or ``bridge`` (a tap on the Linux bridge named by ``bridge``: a provider
    #: network the operator runs).
    network: Literal["user", "bridge"] = "user"
    #: The Linux bridge guests are plugged into in ``bridge`` mode.
    bridge: str | None = Field(default=None, min_length=1, max_length=15)
    #: In ``user`` mode, the port of each guest's forward (on its own loopback address,
    #: see ``KEEL_NETWORK__FORWARD_NAME``) to the guest's port 22.
    ssh_forward_port: int = Field(default=22, ge=1, le=65535)
    #: Give every guest a config drive, whether or not its user asked for one.
    force_config_drive: bool = False
    #: The URI other agents' libvirt clients use to reach this host's libvirtd when they
    #: live-migrate a guest here (``qemu+tcp://HOST/system``, ``qemu+ssh://...``); unset,
    #: ``uri`` (enough when every agent is on one machine).
    migration_uri: str | None = Field(default=None, min_length=1)
    #: The address this host's QEMU listens on for a live migration's memory and disk
    #: streams (the host's address on the migration network).
    migration_address: str = Field(default="127.0.0.1", min_length=1)
    #: The most MiB/s a live migration this host sends may use; 0: no limit.
    migration_bandwidth_mib: int = Field(default=0, ge=0)
    #: Let QEMU slow a migrating guest's vCPUs while it dirties memory faster than the
    #: copy goes (libvirt's auto-converge), so that a busy guest's migration ends.
    migration_auto_converge: bool = True

    @model_validator(mode="after")
    def _bridge_named(self) -> LibvirtSettings:
        if self.network == "bridge" and self.bridge is None:
            raise ValueError("network bridge needs the bridge's name (KEEL_LIBVIRT__BRIDGE)")
        return self


class ImageSettings(_Group):
    """Image data: keel-api's file store, and the download URLs agents are given."""

    #: Where keel-api keeps image files (shared by every keel-api of a deployment).
    store_dir: Path = Path("/var/lib/keel/image-store")
    #: The largest image file keel-api accepts; a larger upload is refused with 413.
    max_size_bytes: int = Field(default=1024**4, ge=1)
    #: The secret keel-api and keel-conductor share to sign image download URLs; unset,
    #: no URL is signed or accepted (only the local and fake drivers work).
    url_secret: str | None = Field(default=None, min_length=16, repr=False)
    #: Seconds a signed download URL stays valid.
    url_ttl: float = Field(default=600.0, gt=0, le=86400)
    #: keel-api's base URL as agents reach it (``http://HOST:PORT``); unset, the
    #: address of ``KEEL_API_BIND``.
    download_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")


#: The guest operations a rehearsal can make fail (``KEEL_VIRT__FAIL_OPERATIONS``).
VIRT_OPERATIONS = frozenset(
    {
        "spawn",
        "rebuild",
        "destroy",
        "power_off",
        "power_on",
        "reboot",
        "pause",
        "unpause",
        "suspend",
        "resume",
        "snapshot",
    }
)


class VirtSettings(_Group):
    """For tests and rehearsals only: guest operations that fail or take their time."""

    #: Operations that raise instead of running: spawn, rebuild, destroy, power_off,
    #: power_on, reboot, pause, unpause, suspend, resume (comma-separated).
    fail_operations: str = ""
    #: Seconds every guest operation takes before it runs.
    delay_s: float = Field(default=0.0, ge=0, le=3600)

    @field_validator("fail_operations")
    @classmethod
    def _known_operations(cls, value: str) -> str:
        unknown = set(cls.names(value)) - VIRT_OPERATIONS
        if unknown:
            known = ", ".join(sorted(VIRT_OPERATIONS))
            raise ValueError(f"unknown operations {sorted(unknown)}; known: {known}")
        return value

    @staticmethod
    def names(value: str) -> list[str]:
        return [name.strip() for name in value.split(",") if name.strip()]

    @property
    def failing(self) -> frozenset[str]:
        return frozenset(self.names(self.fail_operations))


#: Network ids derive from the network's name in this namespace unless set explicitly.
NETWORK_ID_NAMESPACE = uuid.UUID("5d0c1a44-2f0e-4f6b-9a51-6b65656c0001")
#: The largest network keel hands addresses out of (a /12: about a million addresses),
#: because every address it may hand out is a row in ``fixed_ips``.
NETWORK_MIN_PREFIX = 12
#: The smallest: a /30 has one address left besides network, gateway and broadcast.
NETWORK_MAX_PREFIX = 30


class NetworkSettings(_Group):
    """The network servers get their fixed IPv4 address from."""

    name: str = Field(default="private", min_length=1, max_length=255)
    cidr: str = "10.0.0.0/16"
    #: The network's id as clients name it; unset means derived from ``name``.
    id: uuid.UUID | None = None
    #: keel-api: when set, the servers' ``addresses`` also show, under this network name,
    #: the loopback address each guest's SSH is forwarded from (libvirt agents in
    #: ``KEEL_LIBVIRT__NETWORK=user`` mode); unset, none is shown.
    forward_name: str | None = Field(default=None, min_length=1, max_length=255)

    @field_validator("cidr")
    @classmethod
    def _ipv4_network(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"must be an IPv4 network such as 10.0.0.0/16 ({exc})") from None
        if not NETWORK_MIN_PREFIX <= network.prefixlen <= NETWORK_MAX_PREFIX:
            raise ValueError(
                f"the prefix length must be between /{NETWORK_MIN_PREFIX} and "
                f"/{NETWORK_MAX_PREFIX}, not /{network.prefixlen}"
            )
        return str(network)

    @property
    def network_id(self) -> uuid.UUID:
        return self.id or uuid.uuid5(NETWORK_ID_NAMESPACE, self.name)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cidr)


class QuotaSettings(_Group):
    """Per-project limits that apply unless an admin sets others; -1 means unlimited."""

    #: Servers a project may have.
    instances: int = Field(default=10, ge=-1)
    #: vCPUs a project's servers may have, summed over their flavors.
    cores: int = Field(default=20, ge=-1)
    #: Memory (MB) a project's servers may have, summed over their flavors.
    ram: int = Field(default=51200, ge=-1)
    #: Key pairs each user may have.
    key_pairs: int = Field(default=100, ge=-1)
    #: Metadata items one server may have.
    metadata_items: int = Field(default=128, ge=-1)
    #: Server groups a project may have.
    server_groups: int = Field(default=10, ge=-1)
    #: Servers one server group may hold.
    server_group_members: int = Field(default=10, ge=-1)


class IdentitySettings(_Group):
    """The embedded identity (the default), or a real Keystone keel-api relies on."""

    #: Seconds a token issued by the identity API stays valid.
    token_expiration: float = Field(default=3600.0, gt=0)
    #: The region every endpoint of the service catalog is in.
    region: str = Field(default="RegionOne", min_length=1, max_length=255)
    #: Keystone's identity URL (``http://keystone:5000/v3``). Set, keel-api validates
    #: tokens against it and serves no identity of its own.
    keystone_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    #: keel-api's service user in Keystone, which may validate tokens (role ``service``
    #: or ``admin``), its project and their domains.
    keystone_username: str | None = Field(default=None, min_length=1)
    keystone_password: str | None = Field(default=None, min_length=1, repr=False)
    keystone_project_name: str = Field(default="service", min_length=1)
    keystone_user_domain_name: str = Field(default="Default", min_length=1)
    keystone_project_domain_name: str = Field(default="Default", min_length=1)
    #: Seconds a token Keystone validated is trusted without asking again (as
    #: keystonemiddleware's ``token_cache_time``): a revocation takes effect within it.
    #: ``0`` asks Keystone on every request.
    token_cache_time: float = Field(default=300.0, ge=0, le=86400)
    #: Seconds one request to Keystone may take before Keystone counts as unreachable.
    keystone_timeout: float = Field(default=10.0, gt=0, le=300)

    @model_validator(mode="after")
    def _service_credentials(self) -> IdentitySettings:
        if self.keystone_url and not (self.keystone_username and self.keystone_password):
            raise ValueError(
                "KEEL_IDENTITY__KEYSTONE_URL needs keel-api's service credentials: set "
                "KEEL_IDENTITY__KEYSTONE_USERNAME and KEEL_IDENTITY__KEYSTONE_PASSWORD"
            )
        return self


def _pin(value: str) -> str:
    """``auto``, a release (name or number) or an explicit ``X.Y``; ValueError otherwise."""
    text = value.strip().lower()
    if text == "auto":
        return text
    if "." in text:
        parse_version(text)
        return text
    release_number(text)
    return text


class UpgradeLevelSettings(_Group):
    """How high an RPC version this process may send, per API (see docs/upgrades.md).

    ``auto`` (the default) follows the oldest service of that binary in the deployment;
    a release name or number pins to what that release speaks; ``X.Y`` pins explicitly.
    """

    compute: str = "auto"
    scheduler: str = "auto"
    #: keel-api's cap for conductor RPCs, so that a request an older conductor cannot
    #: honour (cold migration, a requested destination) is refused with 409 up front.
    conductor: str = "auto"

    @field_validator("compute", "scheduler", "conductor")
    @classmethod
    def _valid_pin(cls, value: str) -> str:
        return _pin(value)


class FencingSettings(_Group):
    """A compute host cut off from the control plane stops its own guests in time."""

    #: Seconds an agent may go without a successful heartbeat before it powers off its
    #: guests (never destroys them); unset: twice ``KEEL_SERVICE_DOWN_TIME``; ``0``: the
    #: agent never fences itself (its host is then evacuated only once forced down).
    self_fence_after: float | None = Field(default=None, ge=0)
    #: Seconds keel-api and keel-conductor add to a self-fencing host's down time and
    #: fence window before they let its servers be evacuated (the agent's time to power
    #: its guests off, and clocks that drift).
    margin: float = Field(default=30.0, ge=0)
    #: A watchdog device keel-fence keeps open and pets (``/dev/watchdog``): a fence that
    #: dies or hangs then resets the host. Unset (the default): no watchdog.
    watchdog_device: Path | None = None


class RecoverySettings(_Group):
    """Automatic evacuation of fenced hosts by keel-conductor (instance HA)."""

    #: ``off``; ``tagged``: servers whose metadata has ``HA_Enabled=True``; ``all``.
    auto_evacuate: Literal["off", "tagged", "all"] = "off"
    #: Most hosts whose servers the conductors start evacuating in any minute, one host
    #: at a time.
    hosts_per_minute: float = Field(default=6.0, gt=0, le=6000)
    #: No automatic evacuation in an availability zone while more than this fraction of
    #: its compute hosts is down: that is a network or control-plane failure.
    max_down_fraction: float = Field(default=0.55, gt=0, le=1)


class OpsSettings(_Group):
    """The operator's page keel-api serves at ``/ops/`` (docs/ops-page.md)."""

    #: Seconds a login to the page lasts; the session then ends and the form is shown.
    session_lifetime: float = Field(default=28800.0, ge=60, le=7 * 86400)
    #: Mark the session cookie ``Secure``: browsers send it over HTTPS only (and to
    #: loopback addresses). Turn it off only to reach the page over plain HTTP on a
    #: network you trust.
    secure_cookie: bool = True


class WorkaroundSettings(_Group):
    #: Start conductor, scheduler and api even while compute services older than this
    #: release supports are registered (a fast-forward upgrade); a warning instead.
    disable_compute_service_check_for_ffu: bool = False
    #: Deprecated and ignored (accepted so configurations carried over from Nova load):
    #: an agent never destroys a guest because a host field differs, only when a
    #: migration record says the instance was safely rebuilt elsewhere.
    destroy_after_evacuate: bool | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
    )

    database_url: str = "postgresql://postgres@127.0.0.1:5432/keel"
    transport_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    #: The topic exchange; queues are named under it, so deployments never share one.
    exchange: str = Field(default="keel", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")
    #: This service's host name (for an agent: the compute host it manages).
    host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=255)
    #: Where an agent keeps its node identity and its guests.
    state_dir: Path = Path("/var/lib/keel")
    #: ``HOST:PORT`` keel-api listens on.
    api_bind: str = "127.0.0.1:8774"
    #: Seconds between heartbeats.
    report_interval: float = Field(default=10.0, gt=0)
    #: A service whose last heartbeat is older than this many seconds is down.
    service_down_time: float = Field(default=60.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: ``auto`` logs JSON unless standard error is a terminal.
    log_format: Literal["auto", "json", "text"] = "auto"
    #: The event loop a service runs on: ``asyncio`` (Python's own, the default) or
    #: ``uvloop`` (libuv's: less CPU per message, query and request; opt-in until agents
    #: move to another RabbitMQ node as surely on it as on asyncio's, see docs).
    event_loop: Literal["uvloop", "asyncio"] = "asyncio"
    #: Seconds an instance may stay in BUILD before the conductor puts it in ERROR; 0 never.
    build_timeout: float = Field(default=600.0, ge=0)
    #: Seconds a move may stay accepted or pre-migrating before the conductor ends it
    #: (record ``error``; an evacuated server in ERROR, a migrated one back on its
    #: source); 0 never.
    move_timeout: float = Field(default=3600.0, ge=0)
    #: Whether a resize may land on the server's own host (Nova's
    #: ``allow_resize_to_same_host``): the guest then takes the new flavor in place.
    allow_resize_to_same_host: bool = False
    #: Seconds a stop, start, reboot or delete may stay in its task before the conductor
    #: clears it; 0 never.
    task_timeout: float = Field(default=600.0, ge=0)
    #: Seconds a finished cold migration waits for confirm or revert before the conductor
    #: confirms it on its owner's behalf; 0 never does (Nova's resize_confirm_window).
    resize_confirm_window: float = Field(default=0.0, ge=0)
    #: Seconds a deleted server is kept SOFT_DELETED (its guest off, its claims and
    #: addresses kept) before the conductor deletes it for good; its owner may restore or
    #: force-delete it meanwhile. 0 (the default) deletes at once (Nova's
    #: reclaim_instance_interval). keel-api and every conductor must agree on it.
    reclaim_instance_interval: float = Field(default=0.0, ge=0)
    #: Seconds a shelved server keeps its guest and claim on its host before the
    #: conductors offload it (Nova's shelved_offload_time): 0 (the default) offloads at
    #: once, -1 never (only ``shelveOffload`` does).
    shelved_offload_time: float = Field(default=0.0, ge=-1)
    #: For tests and rehearsals only: the process kills itself (SIGKILL) on reaching this
    #: fault-injection point (see docs/architecture.md, "Fault injection").
    fault_inject: str | None = None
    #: Seconds the minimum service version of each binary is cached; 0 asks every time.
    service_version_cache_ttl: float = Field(default=60.0, ge=0)
    #: ``HOST:PORT`` to serve Prometheus metrics on; unset, none are served.
    metrics_bind: str | None = None
    #: For upgrade rehearsals only: behave as this older release (name or number).
    emulate_service_version: str | None = None

    api: ApiSettings = Field(default_factory=ApiSettings)
    rpc: RpcSettings = Field(default_factory=RpcSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    virt: VirtSettings = Field(default_factory=VirtSettings)
    libvirt: LibvirtSettings = Field(default_factory=LibvirtSettings)
    images: ImageSettings = Field(default_factory=ImageSettings)
    metadata: MetadataSettings = Field(default_factory=MetadataSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    quota: QuotaSettings = Field(default_factory=QuotaSettings)
    identity: IdentitySettings = Field(default_factory=IdentitySettings)
    upgrade_levels: UpgradeLevelSettings = Field(default_factory=UpgradeLevelSettings)
    workarounds: WorkaroundSettings = Field(default_factory=WorkaroundSettings)
    fencing: FencingSettings = Field(default_factory=FencingSettings)
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    ops: OpsSettings = Field(default_factory=OpsSettings)

    #: The ``--config`` file these settings were read with (not itself a setting).
    _config_file: Path | None = PrivateAttr(default=None)

    @field_validator("transport_url")
    @classmethod
    def _amqp_url(cls, value: str) -> str:
        node_urls(value)  # BadBrokerUrl is a ValueError: the setting is named
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str) -> str:
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("api_bind", "metrics_bind")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:8774")
        return value

    @field_validator("emulate_service_version")
    @classmethod
    def _known_release(cls, value: str | None) -> str | None:
        if value is not None:
            release_number(value)
        return value

    @field_validator("fault_inject")
    @classmethod
    def _known_fault_point(cls, value: str | None) -> str | None:
        if value is not None and value not in POINTS:
            raise ValueError(f"unknown point; one of: {', '.join(sorted(POINTS))}")
        return value

    @model_validator(mode="after")
    def _down_after_several_beats(self) -> Settings:
        if self.service_down_time <= self.report_interval:
            raise ValueError(
                f"KEEL_SERVICE_DOWN_TIME ({self.service_down_time:g}s) must be longer than "
                f"KEEL_REPORT_INTERVAL ({self.report_interval:g}s), or every service "
                "would look down between two heartbeats"
            )
        return self

    @model_validator(mode="after")
    def _fence_after_several_beats(self) -> Settings:
        fence = self.self_fence_after
        if 0 < fence <= 2 * self.report_interval:
            raise ValueError(
                f"KEEL_FENCING__SELF_FENCE_AFTER ({fence:g}s) must be longer than twice "
                f"KEEL_REPORT_INTERVAL ({self.report_interval:g}s), or an agent would fence "
                "itself between two heartbeats; 0 disables self-fencing"
            )
        return self

    def broker_failover(self) -> float:
        """Seconds, at most, an agent whose broker node froze goes without an answered
        heartbeat: the AMQP heartbeat's grace (three heartbeats and a second each),
        connecting to another node, and the next report. It must stay well inside the
        fence's lease, or every agent on a frozen node would fence its host."""
        heartbeat = url_heartbeat(self.transport_url)
        if heartbeat is None:
            heartbeat = self.rpc.heartbeat or BROKER_DEFAULT_HEARTBEAT
        return 3 * (heartbeat + 1) + BROKER_ATTEMPT_TIMEOUT + self.report_interval

    @property
    def self_fence_after(self) -> float:
        """Seconds without a successful heartbeat before an agent fences itself; 0: never."""
        configured = self.fencing.self_fence_after
        return 2 * self.service_down_time if configured is None else configured

    @property
    def service_version(self) -> int:
        """The release this process behaves as: its own, or the one it emulates."""
        if self.emulate_service_version is None:
            return SERVICE_VERSION
        return release_number(self.emulate_service_version)

    @property
    def config_file(self) -> Path | None:
        """The ``--config`` file these settings were read with, if any."""
        return self._config_file

    @property
    def hypervisor_hostname(self) -> str:
        """An agent's hypervisor host name: the setting, or else the host name."""
        return self.compute.hypervisor_hostname or self.host

    @property
    def image_download_url(self) -> str:
        """keel-api's base URL as agents reach it, for signed image downloads."""
        return (self.images.download_url or f"http://{self.api_bind}").rstrip("/")

    @property
    def api_host(self) -> str:
        return self.api_bind.rpartition(":")[0]

    @property
    def api_port(self) -> int:
        return int(self.api_bind.rpartition(":")[2])


#: Settings keyed by secrets: an error names the setting and the field, never the key.
_SECRET_KEYED = (("auth", "tokens"),)


def _setting_name(loc: tuple[int | str, ...]) -> str:
    for prefix in _SECRET_KEYED:
        if loc[: len(prefix)] == prefix and len(loc) > len(prefix):
            name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(prefix).upper()
            field = ".".join(str(part) for part in loc[len(prefix) + 1 :])
            return f"{name} ({field} of one entry)" if field else name
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(part) for part in loc).upper()


def load_settings(config_file: Path | None = None) -> Settings:
    """Build settings from the environment and ``config_file``; raise ConfigError if bad."""
    if config_file is not None:
        try:
            with config_file.open("rb") as stream:
                tomllib.load(stream)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None

    class _Settings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if config_file is not None:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
            return tuple(sources)

    try:
        settings = _Settings()
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ConfigError(
            f"invalid setting {_setting_name(error['loc'])}: {error['msg']}"
            if error["loc"]
            else f"invalid settings: {error['msg'].removeprefix('Value error, ')}"
        ) from None
    settings._config_file = config_file
    return settings


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file; KEEL_* environment variables override it",
    )
