"""The libvirt driver: each guest a QEMU/KVM virtual machine managed through libvirtd.

A guest is a persistent libvirt domain (see :mod:`.domain` for its name, UUID and keel's
metadata) and a directory ``<state_dir>/instances/<uuid>/`` holding its files:

* ``base`` — the image's data, hard-linked from the agent's image cache (checksum
  verified there), so evicting the cached copy never touches a guest;
* ``disk`` — a qcow2 overlay of ``base`` (``qemu-img``), the flavor's root disk size;
* ``kernel``, ``ramdisk`` — for images that name a ``kernel_id`` (and ``ramdisk_id``):
  the guest boots that kernel directly, with the image's ``os_command_line`` or
  ``console=ttyS0``;
* ``console.log`` — the guest's first serial port, written by libvirt's log daemon,
  appended to across reboots.

The directory is assembled under a scratch name and renamed into place, as the local
driver does, then the domain is defined and started. Guests keep running when the agent
stops or crashes: they are libvirt's, and the agent finds them again by their metadata
(:meth:`LibvirtDriver.list_instances` lists only the domains carrying this node's UUID,
so several agents may share one libvirtd). Shutting down is clean first — the ACPI
power button, pressed again every few seconds — and forced after
``KEEL_LIBVIRT__SHUTDOWN_TIMEOUT`` seconds; a soft reboot is such a shutdown followed by
a start, as Nova does it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID
from xml.etree import ElementTree

from services.compute.image_cache import ImageCache
from services.compute.live_rpc import LiveTarget
from services.compute.rpcapi import BootSource, GuestDiagnostics, GuestDisk, InstanceSpec
from services.compute.virt.console import read_tail
from services.compute.virt.driver import HypervisorResources
from services.compute.virt.libvirt import config_drive, disks
from services.compute.virt.libvirt.connection import LibvirtConnection
from services.compute.virt.libvirt.diagnostics import domain_diagnostics
from services.compute.virt.libvirt.domain import (
    NAMESPACE,
    GuestFiles,
    domain_name,
    domain_uuid,
    domain_xml,
    name_prefix,
    parse_metadata,
)
from services.compute.virt.libvirt.interface import GuestNic, NetworkConfig, primary_address
from services.compute.virt.libvirt.metadata_relay import MetadataRelay
from services.compute.virt.libvirt.migration import (
    INCOMING_MARK,
    MigrationConfig,
    destination_xml,
)
from services.compute.virt.libvirt.migration import flags as migration_flags
from services.compute.virt.libvirt.migration import params as migration_params
from services.compute.virt.local import _nearest_existing
from shared.exceptions import BuildFailed, GuestNotFound, KeelError
from shared.objects.flavor import FlavorSnapshot
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)

GIB = 1024**3
INSTANCES_DIR = "instances"
#: Seconds between two presses of the power button while a shutdown is awaited.
SHUTDOWN_NUDGE = 3.0
#: Seconds between two looks at a guest that is shutting down.
SHUTDOWN_POLL = 0.2
#: Seconds between two reports of a live migration's progress.
PROGRESS_INTERVAL = 0.25
_BUILDING = ".building-"
_DELETING = ".deleting-"


def choose_domain_type(setting: str) -> tuple[str, str]:
    """The domain type for ``KEEL_LIBVIRT__DOMAIN_TYPE`` and why it was chosen."""
    if setting != "auto":
        return setting, "set by KEEL_LIBVIRT__DOMAIN_TYPE"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = cpuinfo.read()
    except OSError:
        flags = ""
    has_extensions = " vmx" in flags or " svm" in flags
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
        kvm_opens = True
    except OSError:
        kvm_opens = False
    if kvm_opens and has_extensions:
        return "kvm", "/dev/kvm opens and the CPU has virtualisation extensions"
    if kvm_opens:
        return "qemu", "/dev/kvm opens but the CPU shows no vmx/svm (no nested virtualisation)"
    return "qemu", "/dev/kvm cannot be opened"


class LiveCopyFailed(KeelError):
    """libvirt's live migration did not complete: the guest still runs on its source."""


class LibvirtDriver:
    #: The name a :class:`~services.compute.live_rpc.LiveTarget` of this driver carries.
    driver_name = "libvirt"

    def __init__(
        self,
        connection: LibvirtConnection,
        *,
        state_dir: Path,
        cache: ImageCache,
        domain_type: str = "auto",
        hypervisor_hostname: str | None = None,
        fallback_hostname: str = "localhost",
        shutdown_timeout: float = 60.0,
        vcpus: int | None = None,
        memory_mb: int | None = None,
        local_gb: int | None = None,
        network: NetworkConfig | None = None,
        force_config_drive: bool = False,
        metadata: MetadataRelay | None = None,
        migration: MigrationConfig | None = None,
    ) -> None:
        self._conn = connection
        self.migration = migration or MigrationConfig(uri=connection.uri)
        self.network = network or NetworkConfig()
        self.force_config_drive = force_config_drive
        #: Passes guests' metadata requests on (user mode); ``None``: guests have none.
        self.metadata = metadata
        self.state_dir = state_dir
        self.instances_dir = state_dir / INSTANCES_DIR
        self.cache = cache
        self.domain_type, why = choose_domain_type(domain_type)
        LOG.info("libvirt driver: domain type %s (%s)", self.domain_type, why)
        self._configured_hostname = hypervisor_hostname
        self._hostname = hypervisor_hostname or fallback_hostname
        self.shutdown_timeout = shutdown_timeout
        self._sizes = (vcpus, memory_mb, local_gb)
        self._node_uuid: UUID | None = None
        #: This machine as libvirt names it (where disks are copied from).
        self.machine = fallback_hostname

    # -- identity and host ---------------------------------------------------------

    def hypervisor_hostname(self) -> str:
        return self._hostname

    @property
    def node_uuid(self) -> UUID:
        if self._node_uuid is None:
            raise BuildFailed("the libvirt driver was used before the agent knew its node")
        return self._node_uuid

    async def init_host(self, node_uuid: UUID) -> None:
        self._node_uuid = node_uuid
        await asyncio.to_thread(self._sweep_scratch)
        await asyncio.to_thread(self.cache.sweep)
        guests = await self.list_instances()
        if self._relays_metadata:
            assert self.metadata is not None
            for guest in guests:
                await self.metadata.serve(guest)
        LOG.info(
            "libvirt driver on %s (node %s): %d guest(s) found, guests in %s",
            self._conn.uri,
            node_uuid,
            len(guests),
            self.instances_dir,
        )

    async def open_node(self, node_uuid: UUID) -> None:
        self._node_uuid = node_uuid

    async def resources(self) -> HypervisorResources:
        info, hostname = await self._conn.run(lambda conn: (conn.getInfo(), conn.getHostname()))
        self.machine = str(hostname)
        if self._configured_hostname is None:
            self._hostname = self.machine
        vcpus, memory_mb, local_gb = self._sizes
        if local_gb is None:
            local_gb = shutil.disk_usage(_nearest_existing(self.state_dir)).total // GIB
        running = len(await self.list_instances()) if self._node_uuid is not None else 0
        return HypervisorResources(
            vcpus=vcpus or int(info[2]),
            memory_mb=memory_mb or int(info[1]),
            local_gb=local_gb,
            running_vms=running,
        )

    # -- finding guests ------------------------------------------------------------

    def guest_dir(self, instance_uuid: UUID) -> Path:
        return self.instances_dir / str(instance_uuid)

    async def list_instances(self) -> list[UUID]:
        node = self.node_uuid
        prefix = name_prefix(node)
        libvirt = self._conn.libvirt

        def mine(conn: Any) -> list[UUID]:
            found = []
            for dom in conn.listAllDomains(0):
                if not dom.name().startswith(prefix):
                    continue
                try:
                    text = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, 0)
                except libvirt.libvirtError:
                    continue
                meta = parse_metadata(text)
                if meta is not None and meta.node_uuid == node:
                    found.append(meta.instance_uuid)
            return found

        return await self._conn.run(mine)

    def _lookup(self, conn: Any, instance_uuid: UUID) -> Any:
        """The guest's domain, or ``None`` when libvirt has none.

        By its UUID, or else by its name: a guest that arrived by live migration keeps
        the UUID its first node gave it (libvirt's rule), under this node's name.
        """
        libvirt = self._conn.libvirt
        try:
            return conn.lookupByUUIDString(str(domain_uuid(self.node_uuid, instance_uuid)))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
        try:
            return conn.lookupByName(domain_name(self.node_uuid, instance_uuid))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    async def _domain(self, instance_uuid: UUID) -> Any:
        dom = await self._conn.run(lambda conn: self._lookup(conn, instance_uuid))
        if dom is None:
            raise GuestNotFound(
                f"guest {instance_uuid} has no libvirt domain "
                f"{domain_name(self.node_uuid, instance_uuid)} on {self._conn.uri}"
            )
        return dom

    # -- building and removing -----------------------------------------------------

    async def spawn(self, spec: InstanceSpec) -> None:
        await self._build(spec, made_by=_made_by(spec, "build"))

    async def rebuild(self, spec: InstanceSpec, *, source_disk: GuestDisk | None = None) -> None:
        await self._build(spec, made_by=_made_by(spec, "move"), source_disk=source_disk)

    async def resize(self, instance_uuid: UUID, flavor: FlavorSnapshot) -> None:
        """The shut-off domain redefined with the flavor's memory and vCPUs, its overlay
        grown to the flavor's disk (never shrunk)."""
        dom = await self._domain(instance_uuid)
        disk = self.guest_dir(instance_uuid) / disks.DISK
        await asyncio.to_thread(disks.grow, disk, flavor.root_gb)

        def redefine(conn: Any) -> None:
            root = ElementTree.fromstring(dom.XMLDesc(0))
            for tag in ("memory", "currentMemory"):
                element = root.find(tag)
                if element is not None:
                    element.text, element.attrib = str(flavor.memory_mb), {"unit": "MiB"}
            vcpu = root.find("vcpu")
            if vcpu is not None:
                vcpu.text = str(flavor.vcpus)
            conn.defineXML(ElementTree.tostring(root, encoding="unicode"))

        await self._conn.run(redefine)
        LOG.info(
            "guest %s redefined with flavor %s (%d MiB, %d vCPU, %d GiB disk)",
            instance_uuid,
            flavor.name,
            flavor.memory_mb,
            flavor.vcpus,
            flavor.root_gb,
            extra={"instance_uuid": str(instance_uuid)},
        )

    async def origin(self, instance_uuid: UUID) -> UUID | None:
        dom = await self._domain(instance_uuid)
        libvirt = self._conn.libvirt

        def read(_conn: Any) -> str | None:
            try:
                text: str = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, 0)
            except libvirt.libvirtError:
                return None
            return text

        text = await self._conn.run(read)
        meta = None if text is None else parse_metadata(text)
        if meta is None:
            return _UNKNOWN_ORIGIN
        if meta.made_by == "build":
            return None
        try:
            return UUID(meta.made_by)
        except ValueError:
            return _UNKNOWN_ORIGIN

    async def migration_disk(self, instance_uuid: UUID) -> GuestDisk | None:
        """The stopped guest's overlay, for a cold migration's destination to copy."""
        disk = self.guest_dir(instance_uuid) / disks.DISK
        if not await asyncio.to_thread(disk.is_file):
            raise GuestNotFound(f"guest {instance_uuid} has no disk at {disk}")
        return GuestDisk(machine=self.machine, path=str(disk.resolve()))

    async def snapshot(self, instance_uuid: UUID, target: Path, disk_format: str) -> None:
        """The guest's disk converted (``qemu-img convert``) while its vCPUs are paused (a
        running guest is resumed after, whatever happened) or while it is off."""
        dom = await self._domain(instance_uuid)
        disk = self.guest_dir(instance_uuid) / disks.DISK
        libvirt = self._conn.libvirt

        def pause(_conn: Any) -> bool:
            if dom.isActive() and dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED:
                dom.suspend()
                return True
            return False

        paused = await self._conn.run(pause)
        try:
            await asyncio.to_thread(disks.convert, disk, target, disk_format)
        finally:
            if paused:
                await self._conn.run(lambda _conn: dom.resume())

    async def _build(
        self, spec: InstanceSpec, *, made_by: str, source_disk: GuestDisk | None = None
    ) -> None:
        if spec.boot is None:
            raise BuildFailed(
                f"the build of {spec.uuid} carries no image to boot from: the image has no "
                "data, or keel-conductor signs no download URLs (KEEL_IMAGES__URL_SECRET) "
                "or runs a release before 9"
            )
        files = await self._guest_files(spec, spec.boot, source_disk)
        xml = domain_xml(
            spec,
            node_uuid=self.node_uuid,
            domain_type=self.domain_type,
            files=files,
            made_by=made_by,
            kernel_args=spec.boot.kernel_args,
            nic=self._nic(spec),
        )
        libvirt = self._conn.libvirt
        if self._relays_metadata:
            assert self.metadata is not None
            try:
                await self.metadata.serve(spec.uuid)
            except OSError as exc:
                raise BuildFailed(f"cannot serve guest {spec.uuid}'s metadata: {exc}") from None

        def define_and_start(conn: Any) -> bool:
            dom = self._lookup(conn, spec.uuid) or conn.defineXML(xml)
            if dom.isActive():
                return False
            try:
                dom.create()
            except libvirt.libvirtError as exc:
                if not dom.isActive():
                    raise BuildFailed(
                        f"libvirt could not start guest {spec.uuid}: {exc.get_error_message()}"
                    ) from None
            return True

        started = await self._conn.run(define_and_start)
        LOG.info(
            "guest %s %s as libvirt domain %s (%s, %d MiB, %d vCPU)",
            spec.uuid,
            "started" if started else "was already running",
            domain_name(self.node_uuid, spec.uuid),
            self.domain_type,
            spec.flavor.memory_mb,
            spec.flavor.vcpus,
            extra={"instance_uuid": str(spec.uuid)},
        )

    @property
    def _relays_metadata(self) -> bool:
        """Whether guests reach the metadata service through this agent's sockets (in
        user-mode networking, when the agent is told the service)."""
        return self.metadata is not None and self.network.mode == "user"

    def _nic(self, spec: InstanceSpec) -> GuestNic | None:
        """The guest's interface; none for a server without an address."""
        fixed = primary_address(spec)
        if fixed is None:
            return None
        socket = None
        if self._relays_metadata:
            assert self.metadata is not None
            socket = self.metadata.socket_path(spec.uuid)
        return GuestNic(self.network, fixed, metadata_socket=socket)

    async def _guest_files(
        self, spec: InstanceSpec, boot: BootSource, source_disk: GuestDisk | None
    ) -> GuestFiles:
        """The guest's directory, assembled from the image cache if not there yet."""
        final = self.guest_dir(spec.uuid)
        fetched = await asyncio.gather(
            self.cache.fetch(boot.image),
            *(self.cache.fetch(part) for part in (boot.kernel, boot.ramdisk) if part),
        )
        if not final.is_dir():
            copy = None
            if source_disk is not None:
                copy = disks.DiskCopy(source_disk, local=source_disk.machine == self.machine)
            await asyncio.to_thread(self._assemble, spec, boot, fetched, final, copy)
        drive = final / config_drive.CONFIG_DRIVE
        return GuestFiles(
            disk=final / disks.DISK,
            console_log=final / disks.CONSOLE_LOG,
            kernel=final / disks.KERNEL if boot.kernel else None,
            ramdisk=final / disks.RAMDISK if boot.kernel and boot.ramdisk else None,
            config_drive=drive if await asyncio.to_thread(drive.is_file) else None,
        )

    def _assemble(
        self,
        spec: InstanceSpec,
        boot: BootSource,
        fetched: list[Path],
        final: Path,
        copy: disks.DiskCopy | None,
    ) -> None:
        self.instances_dir.mkdir(parents=True, exist_ok=True)
        scratch = self.instances_dir / f"{_BUILDING}{spec.uuid}-{secrets.token_hex(4)}"
        scratch.mkdir(mode=0o755)
        try:
            disks.assemble(scratch, spec, boot, fetched)
            if spec.config_drive or self.force_config_drive:
                config_drive.make(spec, scratch / config_drive.CONFIG_DRIVE)
            if copy is not None:
                copy.into(scratch / disks.DISK)
                LOG.info(
                    "copied the disk of guest %s from %s:%s",
                    spec.uuid,
                    copy.source.machine,
                    copy.source.path,
                    extra={"instance_uuid": str(spec.uuid)},
                )
            try:
                scratch.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    async def destroy(self, instance_uuid: UUID) -> None:
        libvirt = self._conn.libvirt

        def undefine(conn: Any) -> bool:
            dom = self._lookup(conn, instance_uuid)
            if dom is None:
                return False
            try:
                if dom.isActive():
                    dom.destroy()
                # A suspended guest's saved memory goes with it.
                dom.undefineFlags(
                    libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                )
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    raise
            return True

        removed = await self._conn.run(undefine)
        if self.metadata is not None:
            await self.metadata.stop(instance_uuid)
        await asyncio.to_thread(self._remove_files, instance_uuid)
        if removed:
            LOG.info(
                "destroyed libvirt domain %s and removed its disks",
                domain_name(self.node_uuid, instance_uuid),
                extra={"instance_uuid": str(instance_uuid)},
            )

    def _remove_files(self, instance_uuid: UUID) -> None:
        final = self.guest_dir(instance_uuid)
        trash = self.instances_dir / f"{_DELETING}{instance_uuid}-{secrets.token_hex(4)}"
        with contextlib.suppress(FileNotFoundError):
            final.rename(trash)
        for prefix in (_DELETING, _BUILDING):
            for leftover in self.instances_dir.glob(f"{prefix}{instance_uuid}-*"):
                shutil.rmtree(leftover, ignore_errors=True)

    def _sweep_scratch(self) -> None:
        self.instances_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.instances_dir.iterdir():
            if entry.name.startswith((_BUILDING, _DELETING)):
                shutil.rmtree(entry, ignore_errors=True)
                LOG.warning("removed %s: left half-done by an earlier run", entry)

    # -- live migration ------------------------------------------------------------

    async def prepare_incoming(self, spec: InstanceSpec, migration_uuid: UUID) -> LiveTarget:
        """The guest's directory made ready to receive it (base, an empty overlay of the
        flavor's size, config drive, kernel), its metadata served; the target the source
        needs. A directory another move left (no domain here) is made afresh: the overlay
        must hold nothing but what the copy writes."""
        if spec.boot is None:
            raise BuildFailed(
                f"the live migration of {spec.uuid} carries no image: the destination cannot "
                "make its base (KEEL_IMAGES__URL_SECRET on keel-conductor?)"
            )
        final = self.guest_dir(spec.uuid)
        mark = final / INCOMING_MARK
        dom = await self._conn.run(lambda conn: self._lookup(conn, spec.uuid))
        if dom is None and await asyncio.to_thread(final.is_dir):
            waits_for = await asyncio.to_thread(_read_mark, mark)
            if waits_for != str(migration_uuid):
                await asyncio.to_thread(self._remove_files, spec.uuid)
        files = await self._guest_files(spec, spec.boot, None)
        if dom is None:
            await asyncio.to_thread(mark.write_text, str(migration_uuid))
        if self._relays_metadata:
            assert self.metadata is not None
            try:
                await self.metadata.serve(spec.uuid)
            except OSError as exc:
                raise BuildFailed(f"cannot serve guest {spec.uuid}'s metadata: {exc}") from None
        xml = domain_xml(
            spec,
            node_uuid=self.node_uuid,
            domain_type=self.domain_type,
            files=files,
            made_by=str(migration_uuid),
            kernel_args=spec.boot.kernel_args,
            nic=self._nic(spec),
        )
        return LiveTarget(
            driver=self.driver_name,
            uri=self.migration.uri,
            address=self.migration.address,
            definition=xml,
        )

    async def discard_incoming(self, instance_uuid: UUID, migration_uuid: UUID) -> None:
        """Remove what :meth:`prepare_incoming` made for ``migration_uuid``, if no guest
        arrived (a directory another move or a build made is kept)."""
        dom = await self._conn.run(lambda conn: self._lookup(conn, instance_uuid))
        if dom is not None:
            return
        final = self.guest_dir(instance_uuid)
        if await asyncio.to_thread(_read_mark, final / INCOMING_MARK) != str(migration_uuid):
            return
        if self.metadata is not None:
            await self.metadata.stop(instance_uuid)
        await asyncio.to_thread(self._remove_files, instance_uuid)
        LOG.info(
            "removed the directory prepared for guest %s: live migration %s ended before "
            "the guest arrived",
            instance_uuid,
            migration_uuid,
            extra={"instance_uuid": str(instance_uuid), "migration_uuid": str(migration_uuid)},
        )

    async def arrived(self, instance_uuid: UUID) -> None:
        """The guest that came live is this node's now: its directory waits no more."""
        mark = self.guest_dir(instance_uuid) / INCOMING_MARK
        await asyncio.to_thread(mark.unlink, missing_ok=True)

    async def migrate_live(
        self,
        instance_uuid: UUID,
        target: LiveTarget,
        report: Callable[[tuple[int, int], tuple[int, int]], Awaitable[bool]],
    ) -> None:
        """Move the running guest to ``target`` with libvirt (see :mod:`.migration`),
        reporting the job's progress to ``report`` (memory and disk, total and done)
        every :data:`PROGRESS_INTERVAL` seconds; ``report`` answering False aborts the
        job. Returns once the destination holds the guest, paused, and this domain is
        shut off; raises :class:`LiveCopyFailed` when the guest still runs here."""
        dom = await self._domain(instance_uuid)
        libvirt = self._conn.libvirt
        name = ElementTree.fromstring(target.definition).findtext("name") or ""

        try:
            dconn = await asyncio.to_thread(libvirt.open, target.uri)
        except libvirt.libvirtError as exc:
            raise LiveCopyFailed(
                f"cannot connect to the destination's libvirt at {target.uri}: "
                f"{exc.get_error_message()}"
            ) from None

        def move() -> None:
            xml = destination_xml(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE), target.definition)
            settings = migration_params(
                libvirt,
                xml=xml,
                name=name,
                address=target.address,
                bandwidth_mib=self.migration.bandwidth_mib,
            )
            dom.migrate3(
                dconn,
                settings,
                migration_flags(libvirt, auto_converge=self.migration.auto_converge),
            )

        def destination_answers() -> bool:
            # QEMU's stream goes on when the destination's daemon is gone; only its last
            # step would fail. A daemon that stopped answering aborts the copy now.
            try:
                dconn.getLibVersion()
            except libvirt.libvirtError:
                return False
            return True

        def stats(_conn: Any) -> dict[str, int]:
            try:
                found: dict[str, int] = dom.jobStats(0)
            except libvirt.libvirtError:
                return {}
            return found

        def abort(_conn: Any) -> None:
            with contextlib.suppress(libvirt.libvirtError):
                dom.abortJob()

        job = asyncio.ensure_future(asyncio.to_thread(move))
        aborted = lost = False
        try:
            while not job.done():
                await asyncio.wait({job}, timeout=PROGRESS_INTERVAL)
                if job.done() or aborted:
                    continue
                found = await self._conn.run(stats)
                go_on = await report(
                    (found.get("memory_total", 0), found.get("memory_processed", 0)),
                    (found.get("disk_total", 0), found.get("disk_processed", 0)),
                )
                if go_on and not await asyncio.to_thread(destination_answers):
                    lost, go_on = True, False
                if not go_on:
                    aborted = True
                    await self._conn.run(abort)
            await job
        except libvirt.libvirtError as exc:
            why = "its libvirt stopped answering, the copy was aborted" if lost else None
            raise LiveCopyFailed(
                f"libvirt could not move guest {instance_uuid} to {target.uri}: "
                f"{why or exc.get_error_message()}"
            ) from None
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                await asyncio.to_thread(dconn.close)
        LOG.info(
            "guest %s moved to %s by libvirt; it waits there, paused, for the switch-over",
            instance_uuid,
            target.uri,
            extra={"instance_uuid": str(instance_uuid)},
        )

    # -- power ---------------------------------------------------------------------

    async def power_off(self, instance_uuid: UUID) -> None:
        dom = await self._domain(instance_uuid)
        await self._shut_down(dom, instance_uuid)

    async def halt(self, instance_uuid: UUID) -> None:
        dom = await self._domain(instance_uuid)
        await self._conn.run(lambda _conn: self._force_off(dom))

    async def _shut_down(self, dom: Any, instance_uuid: UUID) -> None:
        """Press the power button until the guest is off; force it after the timeout.

        The wait is on the event loop, between short libvirt calls: a guest slow to shut
        down never holds one of the libvirt threads heartbeats need.
        """
        deadline = time.monotonic() + self.shutdown_timeout
        nudged = 0.0
        while await self._conn.run(lambda _conn: bool(dom.isActive())):
            now = time.monotonic()
            if now >= deadline:
                LOG.warning(
                    "guest %s did not shut down within %gs; powering it off",
                    instance_uuid,
                    self.shutdown_timeout,
                    extra={"instance_uuid": str(instance_uuid)},
                )
                await self._conn.run(lambda _conn: self._force_off(dom))
                return
            if now - nudged >= SHUTDOWN_NUDGE:
                await self._conn.run(lambda _conn: self._press_power_button(dom))
                nudged = now
            await asyncio.sleep(SHUTDOWN_POLL)

    def _press_power_button(self, dom: Any) -> None:
        try:
            dom.shutdown()
        except self._conn.libvirt.libvirtError:
            if dom.isActive():
                raise

    def _force_off(self, dom: Any) -> None:
        try:
            dom.destroy()
        except self._conn.libvirt.libvirtError:
            if dom.isActive():
                raise

    async def power_on(self, instance_uuid: UUID) -> None:
        dom = await self._domain(instance_uuid)
        await self._conn.run(lambda _conn: self._start(dom))

    def _start(self, dom: Any) -> None:
        if dom.isActive():
            return
        try:
            dom.create()
        except self._conn.libvirt.libvirtError:
            if not dom.isActive():
                raise

    async def reboot(self, instance_uuid: UUID, *, hard: bool) -> None:
        dom = await self._domain(instance_uuid)
        active = await self._conn.run(lambda _conn: bool(dom.isActive()))
        if hard:
            if active:
                await self._conn.run(lambda _conn: self._force_off(dom))
        elif not active:
            LOG.info("guest %s is off: a soft reboot leaves it off", instance_uuid)
            return
        else:
            await self._shut_down(dom, instance_uuid)
        await self._conn.run(lambda _conn: self._start(dom))

    async def pause(self, instance_uuid: UUID) -> None:
        """libvirt's ``suspend``: the domain's vCPUs stop, its memory stays."""
        dom = await self._domain(instance_uuid)
        libvirt = self._conn.libvirt

        def pause(_conn: Any) -> None:
            if dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED:
                dom.suspend()

        await self._conn.run(pause)

    async def unpause(self, instance_uuid: UUID) -> None:
        dom = await self._domain(instance_uuid)
        libvirt = self._conn.libvirt

        def unpause(_conn: Any) -> None:
            if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
                dom.resume()

        await self._conn.run(unpause)

    async def suspend(self, instance_uuid: UUID) -> None:
        """A managed save: the memory goes to disk and the domain stops."""
        dom = await self._domain(instance_uuid)

        def suspend(_conn: Any) -> None:
            if dom.isActive():
                dom.managedSave(0)

        await self._conn.run(suspend)

    async def resume(self, instance_uuid: UUID) -> None:
        """Starting a domain with a managed save restores it from there."""
        dom = await self._domain(instance_uuid)
        await self._conn.run(lambda _conn: self._start(dom))

    async def diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        """libvirt tells no domain's start time: ``uptime`` is left ``None``."""
        dom = await self._domain(instance_uuid)

        def read(_conn: Any) -> GuestDiagnostics:
            saved = bool(dom.hasManagedSaveImage(0))
            return domain_diagnostics(dom, saved=saved, uptime=None)

        return await self._conn.run(read)

    async def console_output(self, instance_uuid: UUID) -> bytes:
        await self._domain(instance_uuid)
        return await asyncio.to_thread(read_tail, self.guest_dir(instance_uuid) / disks.CONSOLE_LOG)

    async def guest_power(self, instance_uuid: UUID) -> PowerState:
        """RUNNING, PAUSED (vCPUs stopped), SUSPENDED (memory saved, domain off) or SHUTDOWN."""
        dom = await self._domain(instance_uuid)
        libvirt = self._conn.libvirt

        def power(_conn: Any) -> PowerState:
            if dom.isActive():
                paused = dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
                return PowerState.PAUSED if paused else PowerState.RUNNING
            return PowerState.SUSPENDED if dom.hasManagedSaveImage(0) else PowerState.SHUTDOWN

        return await self._conn.run(power)

    async def is_running(self, instance_uuid: UUID) -> bool:
        dom = await self._domain(instance_uuid)
        return bool(await self._conn.run(lambda _conn: dom.isActive()))


#: The origin of a domain whose metadata names no move keel can tell: matches none.
_UNKNOWN_ORIGIN = UUID(int=0)


def _read_mark(mark: Path) -> str | None:
    try:
        return mark.read_text().strip()
    except OSError:
        return None


def _made_by(spec: InstanceSpec, default: str) -> str:
    """What the domain's metadata records as its maker: the move's uuid, or ``build``."""
    return default if spec.origin is None else str(spec.origin)
