"""Service versions and the RPC API versions each release speaks.

``SERVICE_VERSION`` is one integer for the whole code base. Every service stamps it into
its ``services`` row when it registers and on every heartbeat. A change that adds or
changes an RPC method bumps ``SERVICE_VERSION`` and appends a line to
``SERVICE_VERSION_HISTORY`` saying which RPC API versions that release speaks; each
release also has a name, usable wherever a setting takes a release
(``KEEL_UPGRADE_LEVELS__COMPUTE=bulwark``).

History:

* 0 — never used: a row with version 0 was written by something that did not report.
* 1 (``arbor``) — first release: compute 1.0, conductor 1.0, scheduler 1.0.
* 2 (``bulwark``) — delivery semantics: conductor 1.1 (``check_build``: an agent asks
  whether a build it was sent is still wanted before and after creating the guest).
* 3 (``capstan``) — server power actions: compute 1.1 (``stop_instance``,
  ``start_instance``, ``reboot_instance``; the instance a build carries gains its
  addresses, metadata and user data), conductor 1.2 (``instance_action_result``).
* 4 (``davit``) — stable compute identity: conductor 1.3 (``resolve_compute``: an agent
  asks what the database knows about its host before it creates an identity file or
  registers).
* 5 (``eyebolt``) — evacuation: compute 1.2 (``rebuild_instance``), conductor 1.4
  (``evacuate_instance``, ``move_result``, ``report_guests``, ``evacuation_confirmed``),
  scheduler 1.1 (claims for a move's migration, avoids nodes by UUID).
* 6 (``fairlead``) — cold migration: compute 1.3 (``prepare_migration``,
  ``remove_moved_guest``, ``finish_revert``), conductor 1.5 (``migrate_instance``,
  ``confirm_migration``, ``revert_migration``, ``copy_removed``).
* 7 (``gantline``) — requested destination: conductor 1.6 (``build_instances`` carries
  the host and/or node an admin asked for), scheduler 1.2 (``select_destinations``
  narrows candidates to a requested destination, or, forced, skips the filters).
* 8 (``halyard``) — console output: compute 1.4 (``get_console_output``: the end of a
  guest's console log, for ``os-getConsoleOutput``).
* 9 (``inhaul``) — images with data: compute 1.5 (builds and rebuilds carry the image,
  kernel and ramdisk to boot from, with signed download URLs, for the libvirt driver).
* 10 (``jackstay``) — cold migration copies the disk: compute 1.6 (``prepare_migration``
  answers where the source disk is; ``rebuild_instance`` carries it to the destination).
* 11 (``hawser``) — guest origins: compute 1.7 (a rebuilt guest records the move that
  made it; a destination never adopts a guest another move or a build left; copies are
  removed for a move only if that move made them).
* 12 (``kedge``) — power state follows the host: conductor 1.7 (``report_guests``
  carries each guest's power state).
* 13 (``lanyard``) — pause and suspend: compute 1.8 (``pause_instance``,
  ``unpause_instance``, ``suspend_instance``, ``resume_instance``, ``get_host_uptime``),
  conductor 1.8 (``instance_action_result`` reports those four actions too).
* 14 (``marline``) — self-fencing agents: conductor 1.9 (``register_compute`` and
  ``service_heartbeat`` carry the agent's ``self_fence_after``: how long it goes
  without a heartbeat before it powers its guests off; 0 if it never does).
* 15 (``norman``) — resize: conductor 1.10 (``resize_instance``: a cold migration with a
  new flavor).
* 16 (``oakum``) — a resize on its own host: compute 1.9 (``rebuild_instance`` may resize
  the existing guest in place; ``finish_revert`` may give it its old flavor back).
* 17 (``painter``) — requests taken or withdrawn, never both: conductor 1.11
  (``take_request``: an agent takes keel-api's request before it stops, starts, reboots,
  pauses, unpauses, suspends, resumes or deletes a guest; a request keel-api withdrew
  is not acted on).
* 18 (``quoin``) — host fences and copy tokens: conductor 1.12 (``service_heartbeat``
  carries the lease of the host's armed fence, keel-fence, and only such a host counts
  as fenced once its silence outlasts that lease; ``check_build``,
  ``instance_build_result`` and ``report_guests`` carry each guest's copy token).
* 19 (``rivet``) — server groups: scheduler 1.3 (``select_destinations`` honours the
  server group the instance is in, read under the group's lock in the transaction that
  claims; keel-api accepts the ``group`` scheduler hint only once every scheduler speaks
  it).
* 20 (``sheave``) — server diagnostics: compute 1.10 (``get_instance_diagnostics``: what
  the driver knows of a guest).
* 21 (``thimble``) — guests people can use: compute 1.11 (the instance a build or rebuild
  carries gains what its config drive and the metadata service tell the guest: project,
  zone, launch index, key pair, ``config_drive``, and its networks' ranges).
* 22 (``uphaul``) — late moves build nothing: conductor 1.13 (``check_move``: a
  destination asks whether the move still waits for its copy there before it builds
  one, and again after, as a build asks ``check_build``).
* 23 (``vang``) — rebuild: compute 1.12 (``rebuild_guest``: the server's guest is made
  again on its own host from a new image), conductor 1.14 (``instance_action_result``
  reports a rebuild; ``take_request`` may ask that the request's task still be under
  way on the agent's node).
* 24 (``whipping``) — soft delete: compute 1.13 (``soft_delete_instance``,
  ``restore_instance``: power a soft-deleted server's guest off, or on again), conductor
  1.15 (``instance_action_result`` reports ``soft_delete`` and ``restore``).
* 25 (``xebec``) — guest host names: compute 1.14 (the instance a build or rebuild
  carries gains the ``hostname`` the server keeps, asked for from compute API 2.90);
  conductors end an evacuation recorded ``end_stopped`` (compute API 2.95) with the
  server stopped, which keel-api asks for only once every conductor is of this release.
* 26 (``yardarm``) — server snapshots: compute 1.15 (``snapshot_instance``: the agent
  writes the guest's disk into an image through a signed upload URL), conductor 1.16
  (``instance_action_result`` reports ``snapshot``).
* 27 (``yawl``) — live migration: compute 1.16 (``prepare_live_migration``,
  ``live_migrate``, ``start_live_copy``, ``rollback_live_migration``), conductor 1.17
  (``live_migrate_instance``, ``live_migration_progress``, ``live_migration_switch``).
* 28 (``zephyr``) — shelve: compute 1.17 (``shelve_instance``: power the guest off and
  write its disk into the shelved image; ``shelve_offload_instance``: destroy a shelved
  guest; ``unshelve_instance``: power a shelved guest on again), conductor 1.18
  (``unshelve_instance``: schedule an offloaded server again and build it from its
  shelved image; ``instance_action_result`` reports ``shelve``, ``shelve_offload`` and
  ``unshelve``).
* 29 (``bowline``) — live migration by the driver: compute 1.18 (``prepare_live_migration``
  answers how the destination takes the guest — the libvirt driver's URI and domain
  XML —, which ``live_migrate`` carries to the source: its driver moves the guest itself,
  instead of the simulated copy and a fresh start on the destination).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

RpcApi = Literal["compute", "conductor", "scheduler"]


class ReleaseApis(BaseModel):
    """The highest RPC API versions one service version speaks."""

    model_config = ConfigDict(frozen=True)

    compute: str
    conductor: str
    scheduler: str

    def version_of(self, api: RpcApi) -> str:
        version: str = getattr(self, api)
        return version


SERVICE_VERSION_HISTORY: tuple[ReleaseApis | None, ...] = (
    None,
    ReleaseApis(compute="1.0", conductor="1.0", scheduler="1.0"),
    ReleaseApis(compute="1.0", conductor="1.1", scheduler="1.0"),
    ReleaseApis(compute="1.1", conductor="1.2", scheduler="1.0"),
    ReleaseApis(compute="1.1", conductor="1.3", scheduler="1.0"),
    ReleaseApis(compute="1.2", conductor="1.4", scheduler="1.1"),
    ReleaseApis(compute="1.3", conductor="1.5", scheduler="1.1"),
    ReleaseApis(compute="1.3", conductor="1.6", scheduler="1.2"),
    ReleaseApis(compute="1.4", conductor="1.6", scheduler="1.2"),
    ReleaseApis(compute="1.5", conductor="1.6", scheduler="1.2"),
    ReleaseApis(compute="1.6", conductor="1.6", scheduler="1.2"),
    ReleaseApis(compute="1.7", conductor="1.6", scheduler="1.2"),
    ReleaseApis(compute="1.7", conductor="1.7", scheduler="1.2"),
    ReleaseApis(compute="1.8", conductor="1.8", scheduler="1.2"),
    ReleaseApis(compute="1.8", conductor="1.9", scheduler="1.2"),
    ReleaseApis(compute="1.8", conductor="1.10", scheduler="1.2"),
    ReleaseApis(compute="1.9", conductor="1.10", scheduler="1.2"),
    ReleaseApis(compute="1.9", conductor="1.11", scheduler="1.2"),
    ReleaseApis(compute="1.9", conductor="1.12", scheduler="1.2"),
    ReleaseApis(compute="1.9", conductor="1.12", scheduler="1.3"),
    ReleaseApis(compute="1.10", conductor="1.12", scheduler="1.3"),
    ReleaseApis(compute="1.11", conductor="1.12", scheduler="1.3"),
    ReleaseApis(compute="1.11", conductor="1.13", scheduler="1.3"),
    ReleaseApis(compute="1.12", conductor="1.14", scheduler="1.3"),
    ReleaseApis(compute="1.13", conductor="1.15", scheduler="1.3"),
    ReleaseApis(compute="1.14", conductor="1.15", scheduler="1.3"),
    ReleaseApis(compute="1.15", conductor="1.16", scheduler="1.3"),
    ReleaseApis(compute="1.16", conductor="1.17", scheduler="1.3"),
    ReleaseApis(compute="1.17", conductor="1.18", scheduler="1.3"),
    ReleaseApis(compute="1.18", conductor="1.18", scheduler="1.3"),
)

SERVICE_VERSION = len(SERVICE_VERSION_HISTORY) - 1

#: Services older than this are not supported by this release: conductor, scheduler and
#: api refuse to start while a compute service this old is registered.
OLDEST_SUPPORTED_SERVICE_VERSION = 1

#: Release names, usable in settings instead of numbers.
RELEASE_NAMES: dict[str, int] = {
    "arbor": 1,
    "bulwark": 2,
    "capstan": 3,
    "davit": 4,
    "eyebolt": 5,
    "fairlead": 6,
    "gantline": 7,
    "halyard": 8,
    "inhaul": 9,
    "jackstay": 10,
    "hawser": 11,
    "kedge": 12,
    "lanyard": 13,
    "marline": 14,
    "norman": 15,
    "oakum": 16,
    "painter": 17,
    "quoin": 18,
    "rivet": 19,
    "sheave": 20,
    "thimble": 21,
    "uphaul": 22,
    "vang": 23,
    "whipping": 24,
    "xebec": 25,
    "yardarm": 26,
    "yawl": 27,
    "zephyr": 28,
    "bowline": 29,
}

#: The first release whose agents never register without an identity file the
#: conductor resolved first. A compute service row last written by an older release
#: may belong to an agent that kept no identity file: on upgrade, an agent without one
#: adopts its host's node UUID when that host has exactly one node.
STABLE_IDENTITY_VERSION = 4

#: The first release whose agents report their self-fencing setting: a host whose agent
#: runs an older release never counts as fenced until an operator forces it down.
SELF_FENCING_VERSION = 14

#: The first release whose agents take keel-api's request before acting on a guest
#: (conductor RPC 1.11): keel-api may withdraw a request only while every agent that
#: could receive it is at least this release.
TAKING_REQUESTS_VERSION = 17

#: The first release whose agents keep a host fence (keel-fence) and report its lease:
#: only such a host counts as fenced without an operator.
HOST_FENCE_VERSION = 18

#: The first release whose agents say which copy a guest is (copy tokens, conductor RPC
#: 1.12): an older agent cannot tell its build check whether a guest it has is the
#: server's current copy.
COPY_TOKENS_VERSION = 18


def apis_for(service_version: int) -> ReleaseApis:
    """The RPC API versions spoken by ``service_version``; unknown versions are an error."""
    if not 0 < service_version < len(SERVICE_VERSION_HISTORY):
        raise ValueError(f"unknown service version {service_version}")
    apis = SERVICE_VERSION_HISTORY[service_version]
    assert apis is not None
    return apis


def release_name(service_version: int) -> str:
    for name, number in RELEASE_NAMES.items():
        if number == service_version:
            return name
    return str(service_version)


def release_number(value: str) -> int:
    """A release given as a name (``bulwark``) or a number (``2``); ValueError if unknown."""
    text = value.strip().lower()
    number = RELEASE_NAMES.get(text)
    if number is None and text.isdigit():
        number = int(text)
    if number is None or not 0 < number <= SERVICE_VERSION:
        names = ", ".join(f"{name} ({n})" for name, n in RELEASE_NAMES.items())
        raise ValueError(f"unknown release {value!r}; the releases are {names}")
    return number


def parse_version(version: str) -> tuple[int, int]:
    """``"1.3"`` → ``(1, 3)``; anything else raises ``ValueError``."""
    major, _, minor = version.partition(".")
    if not major.isdigit() or not minor.isdigit():
        raise ValueError(f"bad RPC version {version!r}: expected MAJOR.MINOR")
    return int(major), int(minor)


def is_compatible(requested: str, served: str) -> bool:
    """The oslo.messaging rule: same major, and a minor no higher than the server's."""
    req_major, req_minor = parse_version(requested)
    srv_major, srv_minor = parse_version(served)
    return req_major == srv_major and req_minor <= srv_minor


def first_release_speaking(api: RpcApi, version: str) -> int | None:
    """The first release whose ``api`` reaches ``version``; ``None`` if none does yet."""
    for number in range(1, SERVICE_VERSION + 1):
        if is_compatible(version, apis_for(number).version_of(api)):
            return number
    return None
