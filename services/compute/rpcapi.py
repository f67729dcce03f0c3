"""The client of keel-compute agents: the only way other services talk to them.

Each agent consumes its own topic, ``compute.<service-uuid>``: the routing key comes
from the service's UUID, never from a host name.

Compute RPC API history:

* 1.0 — build_and_run_instance (cast), terminate_instance (cast).
* 1.1 — stop_instance, start_instance, reboot_instance (casts); the instance
  build_and_run_instance carries gains ``addresses``, ``metadata`` and ``user_data``
  (left out for a 1.0 agent, which builds the guest without them).
* 1.2 — rebuild_instance (cast): build an evacuated instance anew on this host.
* 1.3 — cold migration: prepare_migration (call: shut the source guest down, keeping
  it), remove_moved_guest (call: remove the copy a migration left on this host),
  finish_revert (call: bring a reverted instance's source guest back). rebuild_instance
  also builds a migrated instance on its destination.
* 1.4 — get_console_output (call): the end of a guest's console log, optionally only
  its last ``tail_length`` lines.
* 1.5 — the instance build_and_run_instance and rebuild_instance carry gains ``boot``:
  the image (and its kernel and ramdisk) to boot from, each with a short-lived signed
  download URL and its hashes (left out for an older agent, whose drivers need no data).
* 1.6 — cold migration copies the guest's disk: prepare_migration answers where the
  source guest's disk is (``PreparedMigration``), and rebuild_instance carries it as
  ``source_disk`` so the destination copies it instead of starting from the image (an
  older agent answers nothing and is sent none).
* 1.7 — guests know which move made them: the instance rebuild_instance carries gains
  ``origin`` (the move it is built for; the driver keeps it with the guest), and a
  destination never adopts a guest of the server that another move or a build left
  there (the rebuild fails, the guest is kept and stopped); remove_moved_guest gains
  ``only_origin`` (remove the copy only if that move made it). An older agent is sent
  the same messages at its own version and ignores both fields.
* 1.8 — pause_instance, unpause_instance, suspend_instance, resume_instance (casts);
  get_host_uptime (call): the host's uptime line, as ``uptime`` prints it.
* 1.9 — a resize on the guest's own host: rebuild_instance may say ``in_place`` (give
  the existing guest the spec's flavor instead of building one), and finish_revert may
  carry the ``flavor`` to give it back. Sent at 1.9 only when set; the conductor resizes
  on the same host only to an agent of 1.9 or later.
* 1.10 — get_instance_diagnostics (call): what the driver knows of a guest, in the
  standard shape of the compute API's diagnostics (2.48).
* 1.11 — what a guest is told at first boot, for its config drive and the metadata
  service: the instance build_and_run_instance and rebuild_instance carry gains
  ``project_id``, ``availability_zone``, ``launch_index``, ``key_name``, ``key_data``
  (the key pair's public key) and ``config_drive`` (the user asked for one), and each
  of its ``addresses`` its network's ``cidr``. Left out for an older agent, which builds
  guests without them.
* 1.12 — rebuild_guest (cast): make the server's guest again on this, its own, host,
  from the image its spec names (the ``rebuild`` action), and leave it shut down if the
  server was.
* 1.13 — soft_delete_instance and restore_instance (casts): power the guest of a server
  deleted with soft delete on off, or that of a restored one on again; the agent reports
  each as a ``soft_delete`` or ``restore`` result (conductor 1.15).
* 1.14 — the guest's host name: the instance build_and_run_instance, rebuild_instance
  and rebuild_guest carry gains ``hostname`` (asked for at create or update time from
  compute API 2.90, or made from the server's name). Left out for an older agent, which
  makes the host name of a config drive from ``display_name``.
* 1.15 — snapshot_instance (cast): write the guest's disk, in the image's disk format,
  to the image through a signed upload URL, and report a ``snapshot`` result
  (conductor 1.16).
* 1.16 — live migration: prepare_live_migration, start_live_copy,
  rollback_live_migration (calls), live_migrate (cast); see
  :mod:`services.compute.live_rpc`.
* 1.17 — shelve: shelve_instance (cast: power the guest off, write its disk into the
  shelved image through a signed upload URL, report ``shelve``), shelve_offload_instance
  (cast: destroy a shelved guest that is no longer the server's current copy, report
  ``shelve_offload``), unshelve_instance (cast: power a shelved guest on, report
  ``unshelve``); conductor 1.18 takes those results.
* 1.18 — live migration by the driver: prepare_live_migration answers a
  :class:`~services.compute.live_rpc.LiveTarget` when the destination's driver moves
  guests itself (libvirt), and live_migrate carries it to the source.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import Field

from shared.context import RequestContext
from shared.exceptions import ServiceTooOld, Unroutable
from shared.objects.base import KeelModel
from shared.objects.flavor import FlavorSnapshot
from shared.objects.network import FixedIp
from shared.rpc.client import CapSource, Exclude, RPCClient
from shared.rpc.transport import Transport
from shared.versions import SERVICE_VERSION, apis_for

RPC_VERSION = apis_for(SERVICE_VERSION).compute

#: The first compute RPC version of each method (what a cap must reach to send it).
SINCE: dict[str, str] = {
    "build_and_run_instance": "1.0",
    "terminate_instance": "1.0",
    "stop_instance": "1.1",
    "start_instance": "1.1",
    "reboot_instance": "1.1",
    "rebuild_instance": "1.2",
    "prepare_migration": "1.3",
    "remove_moved_guest": "1.3",
    "finish_revert": "1.3",
    "get_console_output": "1.4",
    "pause_instance": "1.8",
    "unpause_instance": "1.8",
    "suspend_instance": "1.8",
    "resume_instance": "1.8",
    "get_host_uptime": "1.8",
    "get_instance_diagnostics": "1.10",
    "rebuild_guest": "1.12",
    "soft_delete_instance": "1.13",
    "restore_instance": "1.13",
    "snapshot_instance": "1.15",
    "prepare_live_migration": "1.16",
    "live_migrate": "1.16",
    "start_live_copy": "1.16",
    "rollback_live_migration": "1.16",
    "shelve_instance": "1.17",
    "shelve_offload_instance": "1.17",
    "unshelve_instance": "1.17",
}

#: The version whose agents check guest origins (rebuild_instance, remove_moved_guest).
ORIGINS = "1.7"

#: The version whose agents resize a guest in place (a resize on its own host).
IN_PLACE = "1.9"

#: The version whose agents are told what a guest reads at first boot (config drives).
GUEST_DATA = "1.11"

#: The version whose agents are told the guest's host name.
GUEST_HOSTNAME = "1.14"
#: What a 1.11 agent does not know of a build or rebuild: the guest's host name.
HOSTNAME_EXCLUDE: Exclude = {"instance": {"hostname"}}

#: What a 1.0 agent does not know of a build: the guest's boot-time data.
BUILD_1_0_EXCLUDE: Exclude = {"instance": {"addresses", "metadata", "user_data", "boot"}}
#: What an agent before 1.5 does not know of a build or rebuild: the image downloads.
BOOT_EXCLUDE: Exclude = {"instance": {"boot"}, "source_disk": True}
#: What a 1.5 agent does not know of a rebuild: the migrated disk to copy.
SOURCE_DISK_EXCLUDE: Exclude = {"source_disk"}
#: What an agent before 1.11 does not know of a build or rebuild: the guest's data for
#: its config drive, and its networks' ranges.
_GUEST_DATA_FIELDS = ("project_id", "availability_zone", "launch_index", "key_name",
                      "key_data", "config_drive", "hostname")  # fmt: skip
_GUEST_DATA_INSTANCE: dict[str, Any] = {
    **dict.fromkeys(_GUEST_DATA_FIELDS, True),
    "addresses": {"__all__": {"cidr"}},
}
GUEST_DATA_EXCLUDE: Exclude = {"instance": _GUEST_DATA_INSTANCE}


def _with_guest_data_excluded(exclude: Exclude | None) -> Exclude:
    """``exclude`` and :data:`GUEST_DATA_EXCLUDE` together (for senders below 1.11)."""
    instance: dict[str, Any] = dict(_GUEST_DATA_INSTANCE)
    merged: dict[str, Any] = {"instance": instance}
    if isinstance(exclude, set):
        merged.update(dict.fromkeys(exclude, True))
        return merged
    for key, value in (exclude or {}).items():
        if key != "instance":
            merged[key] = value
        elif isinstance(value, set):
            instance.update(dict.fromkeys(value, True))
        else:
            instance.update(value)
    return merged


def topic_for(service_uuid: UUID) -> str:
    return f"compute.{service_uuid}"


class ImageFile(KeelModel):
    """One image's data as an agent fetches it: a signed URL valid for minutes, hashes."""

    id: UUID
    name: str | None = None
    url: str
    size: int | None = Field(default=None, ge=0)
    disk_format: str | None = None
    #: MD5 of the data, hexadecimal (Glance's ``checksum``).
    checksum: str | None = None
    #: ``sha512`` with its hexadecimal digest, when the image was uploaded to keel.
    os_hash_algo: str | None = None
    os_hash_value: str | None = None


class BootSource(KeelModel):
    """What a guest boots from: the image, and a kernel and ramdisk for direct boot."""

    image: ImageFile
    kernel: ImageFile | None = None
    ramdisk: ImageFile | None = None
    #: The kernel command line (the image's ``os_command_line``), if it sets one.
    kernel_args: str | None = None


class GuestDisk(KeelModel):
    """Where a stopped guest's disk can be copied from (1.6)."""

    #: The machine holding it: its hypervisor's own host name (libvirt's), reached over
    #: SSH when it is not the copying agent's machine.
    machine: str = Field(max_length=255)
    #: The disk file's absolute path on that machine.
    path: str = Field(max_length=4096)
    #: The image the disk is an overlay of (its backing file), if any.
    image_id: UUID | None = None


class PreparedMigration(KeelModel):
    """What prepare_migration answers (1.6): the source guest's disk, if it has one to copy."""

    disk: GuestDisk | None = None


class InstanceSpec(KeelModel):
    """What an agent needs to build a guest."""

    uuid: UUID
    display_name: str = Field(max_length=255)
    flavor: FlavorSnapshot
    image_ref: str = ""
    node: str
    #: What the guest is told at first boot (1.1): its fixed addresses, the server's
    #: metadata and the user data (base64, as the user gave it).
    addresses: list[FixedIp] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    user_data: str | None = None
    #: Where the image's data comes from (1.5); ``None`` when the deployment signs no
    #: download URLs or the image has no data.
    boot: BootSource | None = None
    #: The move this copy is built for (1.6); ``None`` for a server's first build.
    origin: UUID | None = None
    #: What the guest reads of itself at first boot (1.11): its config drive and the
    #: metadata service say the same.
    project_id: str = ""
    availability_zone: str | None = None
    launch_index: int = 0
    key_name: str | None = None
    #: The key pair's public key (OpenSSH format, or an X.509 certificate).
    key_data: str | None = None
    #: The user asked for a config drive (``--config-drive true``).
    config_drive: bool = False
    #: The host name the server keeps (microversion 2.90); ``None`` for a server created
    #: before keel kept one: the guest's is then made from ``display_name``. Agents that
    #: do not know the field make it from the name, as they did.
    hostname: str | None = None


class BuildAndRunInstance(KeelModel):
    instance: InstanceSpec


class TerminateInstance(KeelModel):
    instance_uuid: UUID


class StopInstance(KeelModel):
    instance_uuid: UUID


class StartInstance(KeelModel):
    instance_uuid: UUID


class RebootType(StrEnum):
    SOFT = "SOFT"
    HARD = "HARD"


class RebootInstance(KeelModel):
    instance_uuid: UUID
    reboot_type: RebootType = RebootType.SOFT


class RebuildInstance(KeelModel):
    """Build an evacuated instance on this (destination) host, for ``migration_uuid``."""

    instance: InstanceSpec
    migration_uuid: UUID
    #: Leave the rebuilt guest shut down (the instance was stopped when evacuated).
    powered_off: bool = False
    #: A cold migration's source disk, to copy instead of starting from the image (1.6).
    source_disk: GuestDisk | None = None
    #: A resize on this, the guest's own, host (1.9): give the existing guest the spec's
    #: flavor in place instead of building a copy.
    in_place: bool = False


class RebuildGuest(KeelModel):
    """Make the server's guest again on this, its own, host from ``instance.image_ref``."""

    instance: InstanceSpec
    #: Leave the new guest shut down (the server was SHUTOFF, and stays so).
    powered_off: bool = False


class SnapshotInstance(KeelModel):
    """Write the guest's disk into image ``image_id`` (1.15) through ``upload_url``."""

    instance_uuid: UUID
    image_id: UUID
    #: The format the image's data is written in (``qcow2`` or ``raw``).
    disk_format: str = "qcow2"
    #: A signed URL keel-api takes the data on, valid for minutes (``PUT``).
    upload_url: str


class ShelveInstance(SnapshotInstance):
    """Power the guest off and write its disk into the shelved image ``image_id`` (1.17)."""


class PrepareMigration(KeelModel):
    """Shut the guest down on this (source) host for ``migration_uuid``; keep its data."""

    instance_uuid: UUID
    migration_uuid: UUID


class RemoveMovedGuest(KeelModel):
    """Remove this host's copy of the guest, which ``migration_uuid`` made redundant."""

    instance_uuid: UUID
    migration_uuid: UUID
    #: Remove the copy only if this move made it (1.4): another is kept, with a warning.
    only_origin: UUID | None = None


class FinishRevert(KeelModel):
    """The migration was reverted: the guest on this (source) host is the instance again."""

    instance_uuid: UUID
    migration_uuid: UUID
    #: Start the guest (the instance was running before it was migrated).
    power_on: bool = True
    #: A resize on its own host was reverted (1.9): give the guest this flavor back first.
    flavor: FlavorSnapshot | None = None


class GetConsoleOutput(KeelModel):
    """The end of the guest's console log; ``tail_length`` lines of it, or all it keeps."""

    instance_uuid: UUID
    tail_length: int | None = Field(default=None, ge=0)


class GetInstanceDiagnostics(KeelModel):
    instance_uuid: UUID


class CpuDiagnostics(KeelModel):
    id: int | None = None
    #: CPU time used, in nanoseconds.
    time: int | None = None
    utilisation: int | None = None


class NicDiagnostics(KeelModel):
    mac_address: str | None = None
    rx_octets: int | None = None
    rx_errors: int | None = None
    rx_drop: int | None = None
    rx_packets: int | None = None
    rx_rate: int | None = None
    tx_octets: int | None = None
    tx_errors: int | None = None
    tx_drop: int | None = None
    tx_packets: int | None = None
    tx_rate: int | None = None


class DiskDiagnostics(KeelModel):
    read_bytes: int | None = None
    read_requests: int | None = None
    write_bytes: int | None = None
    write_requests: int | None = None
    errors_count: int | None = None


class MemoryDiagnostics(KeelModel):
    #: MiB the guest may use, and uses.
    maximum: int | None = None
    used: int | None = None


class GuestDiagnostics(KeelModel):
    """A guest as its driver sees it (1.10), in the compute API's 2.48 shape."""

    #: ``running``, ``shutdown``, ``paused``, ``suspended``, ``pending`` or ``crashed``.
    state: str
    #: The driver family, as the API names it (``libvirt``...).
    driver: str
    hypervisor: str | None = None
    hypervisor_os: str | None = None
    #: Seconds since the guest started; ``None`` when it is not running.
    uptime: int | None = None
    config_drive: bool = False
    cpu_details: list[CpuDiagnostics] = Field(default_factory=list)
    nic_details: list[NicDiagnostics] = Field(default_factory=list)
    disk_details: list[DiskDiagnostics] = Field(default_factory=list)
    memory_details: MemoryDiagnostics = Field(default_factory=MemoryDiagnostics)


class ConsoleOutput(KeelModel):
    #: The log as text: bytes that are not ASCII become U+FFFD, as Nova shows them.
    output: str


class GuestAction(KeelModel):
    """Pause, unpause, suspend or resume one guest (1.7)."""

    instance_uuid: UUID


class GetHostUptime(KeelModel):
    """The agent's host uptime (1.7); the request carries nothing."""


class HostUptime(KeelModel):
    #: As ``uptime`` prints it: `` 08:32:11 up 93 days, 18:25,  load average: ...``.
    uptime: str


class ComputeAPI:
    def __init__(
        self,
        transport: Transport,
        *,
        version_cap: str | CapSource = RPC_VERSION,
        timeout: float = 60.0,
    ) -> None:
        self.client = RPCClient(transport, "compute", version_cap=version_cap, timeout=timeout)

    async def can_send(self, method: str) -> bool:
        """Whether the cap lets ``method`` be sent at all."""
        return await self.client.can_send_version(SINCE[method])

    async def build_and_run_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance: InstanceSpec
    ) -> None:
        req = BuildAndRunInstance(instance=instance)
        client = self.client.for_topic(topic_for(service_uuid))
        if await client.can_send_version(GUEST_HOSTNAME):
            await client.cast(ctx, "build_and_run_instance", req, version=GUEST_HOSTNAME)
            return
        if await client.can_send_version(GUEST_DATA):
            await client.cast(
                ctx, "build_and_run_instance", req, version=GUEST_DATA, exclude=HOSTNAME_EXCLUDE
            )
            return
        if await client.can_send_version("1.5"):
            await client.cast(
                ctx,
                "build_and_run_instance",
                req,
                version="1.5",
                exclude=_with_guest_data_excluded(None),
            )
            return
        if await client.can_send_version("1.1"):
            await client.cast(
                ctx,
                "build_and_run_instance",
                req,
                version="1.1",
                exclude=_with_guest_data_excluded(BOOT_EXCLUDE),
            )
            return
        await client.cast(
            ctx,
            "build_and_run_instance",
            req,
            version="1.0",
            exclude=_with_guest_data_excluded(BUILD_1_0_EXCLUDE),
        )

    async def terminate_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self.client.for_topic(topic_for(service_uuid)).cast(
            ctx, "terminate_instance", TerminateInstance(instance_uuid=instance_uuid), version="1.0"
        )

    async def _cast_since(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        method: str,
        req: KeelModel,
        exclude: Exclude | None = None,
        *,
        prefer: str | None = None,
    ) -> None:
        """Send at ``prefer`` if the cap allows, else at the method's first version."""
        client = self.client.for_topic(topic_for(service_uuid))
        if not await client.can_send_version(SINCE[method]):
            raise ServiceTooOld(
                f"{method} needs compute RPC {SINCE[method]}; the cap is {await client.cap()}"
            )
        version = SINCE[method]
        if prefer is not None and await client.can_send_version(prefer):
            version = prefer
        await client.cast(ctx, method, req, version=version, exclude=exclude)

    async def rebuild_guest(
        self, ctx: RequestContext, service_uuid: UUID, spec: InstanceSpec, *, powered_off: bool
    ) -> None:
        req = RebuildGuest(instance=spec, powered_off=powered_off)
        client = self.client.for_topic(topic_for(service_uuid))
        if await client.can_send_version(GUEST_HOSTNAME):
            await client.cast(ctx, "rebuild_guest", req, version=GUEST_HOSTNAME)
            return
        await self._cast_since(ctx, service_uuid, "rebuild_guest", req, HOSTNAME_EXCLUDE)

    async def stop_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        req = StopInstance(instance_uuid=instance_uuid)
        await self._cast_since(ctx, service_uuid, "stop_instance", req)

    async def start_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        req = StartInstance(instance_uuid=instance_uuid)
        await self._cast_since(ctx, service_uuid, "start_instance", req)

    async def reboot_instance(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance_uuid: UUID,
        reboot_type: RebootType,
    ) -> None:
        req = RebootInstance(instance_uuid=instance_uuid, reboot_type=reboot_type)
        await self._cast_since(ctx, service_uuid, "reboot_instance", req)

    async def rebuild_instance(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance: InstanceSpec,
        migration_uuid: UUID,
        *,
        powered_off: bool = False,
        source_disk: GuestDisk | None = None,
        in_place: bool = False,
    ) -> None:
        req = RebuildInstance(
            instance=instance,
            migration_uuid=migration_uuid,
            powered_off=powered_off,
            source_disk=source_disk,
            in_place=in_place,
        )
        client = self.client.for_topic(topic_for(service_uuid))
        if await client.can_send_version(GUEST_HOSTNAME):
            await client.cast(ctx, "rebuild_instance", req, version=GUEST_HOSTNAME)
            return
        if await client.can_send_version(GUEST_DATA):
            await client.cast(
                ctx, "rebuild_instance", req, version=GUEST_DATA, exclude=HOSTNAME_EXCLUDE
            )
            return
        older = _with_guest_data_excluded(None)
        if in_place:
            if not await client.can_send_version(IN_PLACE):
                raise ServiceTooOld(
                    f"a resize on the guest's own host needs compute RPC {IN_PLACE}; the cap "
                    f"is {await client.cap()}"
                )
            await client.cast(ctx, "rebuild_instance", req, version=IN_PLACE, exclude=older)
            return
        for version in (ORIGINS, "1.6"):
            if await client.can_send_version(version):
                await client.cast(ctx, "rebuild_instance", req, version=version, exclude=older)
                return
        if await client.can_send_version("1.5"):
            await client.cast(
                ctx,
                "rebuild_instance",
                req,
                version="1.5",
                exclude=_with_guest_data_excluded(SOURCE_DISK_EXCLUDE),
            )
            return
        await self._cast_since(
            ctx, service_uuid, "rebuild_instance", req, _with_guest_data_excluded(BOOT_EXCLUDE)
        )

    async def _call_since(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        method: str,
        req: KeelModel,
        *,
        prefer: str | None = None,
    ) -> None:
        """Send at ``prefer`` if the cap allows, else at the method's first version."""
        client = self.client.for_topic(topic_for(service_uuid))
        if not await client.can_send_version(SINCE[method]):
            raise ServiceTooOld(
                f"{method} needs compute RPC {SINCE[method]}; the cap is {await client.cap()}"
            )
        version = SINCE[method]
        if prefer is not None and await client.can_send_version(prefer):
            version = prefer
        await client.call(ctx, method, req, version=version)

    async def get_console_output(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance_uuid: UUID,
        *,
        tail_length: int | None = None,
    ) -> str:
        """The guest's console log (its last ``tail_length`` lines if given), as text."""
        method = "get_console_output"
        client = self.client.for_topic(topic_for(service_uuid))
        if not await client.can_send_version(SINCE[method]):
            raise ServiceTooOld(
                f"{method} needs compute RPC {SINCE[method]}; the cap is {await client.cap()}"
            )
        req = GetConsoleOutput(instance_uuid=instance_uuid, tail_length=tail_length)
        reply = await client.call(ctx, method, req, version=SINCE[method], returns=ConsoleOutput)
        return reply.output

    async def prepare_migration(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID, migration_uuid: UUID
    ) -> PreparedMigration:
        """Shut the source guest down; where its disk is (nothing from an agent before 1.6)."""
        req = PrepareMigration(instance_uuid=instance_uuid, migration_uuid=migration_uuid)
        client = self.client.for_topic(topic_for(service_uuid))
        if await client.can_send_version("1.6"):
            return await client.call(
                ctx, "prepare_migration", req, version="1.6", returns=PreparedMigration
            )
        await self._call_since(ctx, service_uuid, "prepare_migration", req)
        return PreparedMigration()

    async def remove_moved_guest(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance_uuid: UUID,
        migration_uuid: UUID,
        *,
        only_origin: UUID | None = None,
    ) -> None:
        req = RemoveMovedGuest(
            instance_uuid=instance_uuid, migration_uuid=migration_uuid, only_origin=only_origin
        )
        await self._call_since(ctx, service_uuid, "remove_moved_guest", req, prefer=ORIGINS)

    async def finish_revert(
        self,
        ctx: RequestContext,
        service_uuid: UUID,
        instance_uuid: UUID,
        migration_uuid: UUID,
        *,
        power_on: bool,
        flavor: FlavorSnapshot | None = None,
    ) -> None:
        req = FinishRevert(
            instance_uuid=instance_uuid,
            migration_uuid=migration_uuid,
            power_on=power_on,
            flavor=flavor,
        )
        prefer = IN_PLACE if flavor is not None else None
        await self._call_since(ctx, service_uuid, "finish_revert", req, prefer=prefer)

    async def pause_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "pause_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def unpause_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "unpause_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def suspend_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "suspend_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def resume_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "resume_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def get_instance_diagnostics(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> GuestDiagnostics:
        """What the guest's driver knows of it (1.10)."""
        method = "get_instance_diagnostics"
        client = self.client.for_topic(topic_for(service_uuid))
        if not await client.can_send_version(SINCE[method]):
            raise ServiceTooOld(
                f"{method} needs compute RPC {SINCE[method]}; the cap is {await client.cap()}"
            )
        req = GetInstanceDiagnostics(instance_uuid=instance_uuid)
        return await client.call(ctx, method, req, version=SINCE[method], returns=GuestDiagnostics)

    async def get_host_uptime(self, ctx: RequestContext, service_uuid: UUID) -> str:
        """The agent's host uptime, as ``uptime`` prints it."""
        method = "get_host_uptime"
        client = self.client.for_topic(topic_for(service_uuid))
        if not await client.can_send_version(SINCE[method]):
            raise ServiceTooOld(
                f"{method} needs compute RPC {SINCE[method]}; the cap is {await client.cap()}"
            )
        if await client.transport.is_consumed(client.topic) is False:
            # A dead agent whose service is not reported down yet: its queue has no
            # consumer, and the call would only wait for its timeout.
            raise Unroutable(f"no agent consumes {client.topic}: its agent is not running")
        reply = await client.call(
            ctx, method, GetHostUptime(), version=SINCE[method], returns=HostUptime
        )
        return reply.uptime

    async def soft_delete_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "soft_delete_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def restore_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "restore_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def snapshot_instance(
        self, ctx: RequestContext, service_uuid: UUID, req: SnapshotInstance
    ) -> None:
        await self._cast_since(ctx, service_uuid, "snapshot_instance", req)

    async def shelve_instance(
        self, ctx: RequestContext, service_uuid: UUID, req: ShelveInstance
    ) -> None:
        await self._cast_since(ctx, service_uuid, "shelve_instance", req)

    async def shelve_offload_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "shelve_offload_instance", GuestAction(instance_uuid=instance_uuid)
        )

    async def unshelve_instance(
        self, ctx: RequestContext, service_uuid: UUID, instance_uuid: UUID
    ) -> None:
        await self._cast_since(
            ctx, service_uuid, "unshelve_instance", GuestAction(instance_uuid=instance_uuid)
        )
