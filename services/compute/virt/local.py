"""The local virt driver: each guest is a directory in the agent's state dir.

A guest is ``<state_dir>/instances/<uuid>/`` holding ``disk`` (a sparse file of the
flavor's ``root_gb`` GiB: its size is set, no data is written) and ``metadata.json``
(the :class:`~services.compute.rpcapi.InstanceSpec` it was built from: with its fixed
addresses, metadata and user data, what a guest reads at first boot) and
``console.log``, which the driver writes as a guest's console would show it: a line when
the guest is made, ``keel-guest-up <uuid>`` each time it "boots" (spawn, power on,
reboot), and a line for each power change. What exists on the host is what an operator
sees with ``ls``.

A guest appears and disappears atomically. It is built in a scratch directory
``instances/.building-<uuid>-<random>`` and renamed into place once complete; it is
removed by renaming it to ``instances/.deleting-<uuid>-<random>`` first. A crash
therefore never leaves a half guest under its own name, only scratch directories, which
:meth:`LocalDriver.init_host` sweeps at the next start and :meth:`LocalDriver.destroy`
sweeps for its guest. Callers serialise operations on one guest (the manager does).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from uuid import UUID

from services.compute.durable import fsync_dir, write_synced
from services.compute.rpcapi import GuestDiagnostics, GuestDisk, InstanceSpec
from services.compute.virt.console import append_line, boot_banner, read_tail, up_line
from services.compute.virt.diagnostics import simulated
from services.compute.virt.driver import HypervisorResources
from shared.exceptions import BuildFailed, GuestNotFound, GuestStateError
from shared.objects.flavor import FlavorSnapshot
from shared.objects.states import PowerState

LOG = logging.getLogger(__name__)

GIB = 1024**3
INSTANCES_DIR = "instances"
DISK_FILE = "disk"
METADATA_FILE = "metadata.json"
#: The origin of a guest whose metadata cannot be read: matches no move and no build.
_UNKNOWN_ORIGIN = UUID(int=0)
POWER_FILE = "power"
CONSOLE_FILE = "console.log"
RUNNING, SHUTDOWN, PAUSED, SUSPENDED = "running", "shutdown", "paused", "suspended"
#: What the console shows when a guest leaves one of these states for RUNNING.
_WOKEN = {PAUSED: "unpaused", SUSPENDED: "resumed from its saved memory"}
_STOPPED_LINES = {SHUTDOWN: "powered off", PAUSED: "paused", SUSPENDED: "suspended: memory saved"}
#: What each state reports as (a saved guest is neither running nor shut down).
_POWER_STATES = {
    RUNNING: PowerState.RUNNING,
    PAUSED: PowerState.PAUSED,
    SUSPENDED: PowerState.SUSPENDED,
}
_BUILDING = ".building-"
_DELETING = ".deleting-"
_GUEST_DIR_MODE = 0o755


class LocalDriver:
    def __init__(
        self,
        state_dir: Path,
        hostname: str,
        *,
        vcpus: int | None = None,
        memory_mb: int | None = None,
        local_gb: int | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.instances_dir = state_dir / INSTANCES_DIR
        self._hostname = hostname
        self._vcpus = vcpus
        self._memory_mb = memory_mb
        self._local_gb = local_gb

    def hypervisor_hostname(self) -> str:
        return self._hostname

    def guest_dir(self, instance_uuid: UUID) -> Path:
        return self.instances_dir / str(instance_uuid)

    async def init_host(self, node_uuid: UUID) -> None:
        swept = await asyncio.to_thread(self._sweep_scratch)
        for name in swept:
            LOG.warning("removed %s: left half-done by an earlier run", self.instances_dir / name)
        LOG.info("local driver keeps guests in %s", self.instances_dir)

    async def open_node(self, node_uuid: UUID) -> None:
        """Nothing to open: the guests are the state directory's."""

    async def resources(self) -> HypervisorResources:
        return await asyncio.to_thread(self._measure)

    async def spawn(self, spec: InstanceSpec) -> None:
        await asyncio.to_thread(self._spawn, spec)

    async def rebuild(self, spec: InstanceSpec, *, source_disk: GuestDisk | None = None) -> None:
        await self.spawn(spec)

    async def migration_disk(self, instance_uuid: UUID) -> GuestDisk | None:
        """A local guest's disk holds no data: the destination makes its own."""
        return None

    async def snapshot(self, instance_uuid: UUID, target: Path, disk_format: str) -> None:
        """The guest's disk file up to the end of the data written to it: the hole after
        it (zeros the file system never stored, most of a local guest's disk) is left
        out, as a raw disk of the flavor's size reads it back. A local guest's disk is
        raw whatever format the image says."""
        await asyncio.to_thread(self._snapshot, instance_uuid, target)

    def _snapshot(self, instance_uuid: UUID, target: Path) -> None:
        disk = self._guest(instance_uuid) / DISK_FILE
        with disk.open("rb") as source, target.open("xb") as copy:
            remaining = _data_end(source.fileno())
            while remaining > 0:
                block = source.read(min(remaining, 1024 * 1024))
                if not block:
                    break
                copy.write(block)
                remaining -= len(block)

    async def destroy(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._destroy, instance_uuid)

    async def list_instances(self) -> list[UUID]:
        return await asyncio.to_thread(self._list)

    async def resize(self, instance_uuid: UUID, flavor: FlavorSnapshot) -> None:
        await asyncio.to_thread(self._resize, instance_uuid, flavor)

    def _resize(self, instance_uuid: UUID, flavor: FlavorSnapshot) -> None:
        guest = self._guest(instance_uuid)
        spec = InstanceSpec.model_validate_json((guest / METADATA_FILE).read_bytes())
        with (guest / DISK_FILE).open("r+b") as disk:
            if flavor.root_gb * GIB > os.fstat(disk.fileno()).st_size:
                disk.truncate(flavor.root_gb * GIB)
                os.fsync(disk.fileno())
        resized = spec.model_copy(update={"flavor": flavor})
        scratch = guest / f".{METADATA_FILE}.{secrets.token_hex(4)}"
        write_synced(scratch, resized.model_dump_json(indent=2).encode())
        os.replace(scratch, guest / METADATA_FILE)
        fsync_dir(guest)
        LOG.info(
            "guest %s now has flavor %s (%d vCPU, %d MB RAM, %d GB disk)",
            instance_uuid,
            flavor.name,
            flavor.vcpus,
            flavor.memory_mb,
            flavor.root_gb,
            extra=_extra(instance_uuid),
        )

    async def origin(self, instance_uuid: UUID) -> UUID | None:
        return await asyncio.to_thread(self._origin, instance_uuid)

    async def guest_power(self, instance_uuid: UUID) -> PowerState:
        state = await asyncio.to_thread(self.power_state, instance_uuid)
        return _POWER_STATES.get(state, PowerState.SHUTDOWN)

    async def power_off(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._set_power, instance_uuid, SHUTDOWN)

    async def halt(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._set_power, instance_uuid, SHUTDOWN)

    async def power_on(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._set_power, instance_uuid, RUNNING)

    async def reboot(self, instance_uuid: UUID, *, hard: bool) -> None:
        await asyncio.to_thread(self._reboot, instance_uuid, hard)

    async def pause(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._change, instance_uuid, (RUNNING,), PAUSED)

    async def unpause(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._change, instance_uuid, (PAUSED,), RUNNING)

    async def suspend(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._change, instance_uuid, (RUNNING, PAUSED), SUSPENDED)

    async def resume(self, instance_uuid: UUID) -> None:
        await asyncio.to_thread(self._change, instance_uuid, (SUSPENDED,), RUNNING)

    def _change(self, instance_uuid: UUID, from_states: tuple[str, ...], to: str) -> None:
        """Move the guest from one of ``from_states`` to ``to``; already there is done."""
        current = self.power_state(instance_uuid)
        if current == to:
            LOG.info("guest %s is already %s", instance_uuid, to, extra=_extra(instance_uuid))
            return
        if current not in from_states:
            raise GuestStateError(f"guest {instance_uuid} is {current}, so it cannot become {to}")
        self._set_power(instance_uuid, to)

    async def diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        return await asyncio.to_thread(self._diagnostics, instance_uuid)

    def _diagnostics(self, instance_uuid: UUID) -> GuestDiagnostics:
        guest = self._guest(instance_uuid)
        spec = InstanceSpec.model_validate_json((guest / METADATA_FILE).read_bytes())
        state = self.power_state(instance_uuid)
        try:
            since = (guest / POWER_FILE).stat().st_mtime
        except FileNotFoundError:
            since = (guest / METADATA_FILE).stat().st_mtime
        uptime = max(0, int(time.time() - since))
        return simulated(spec, state=state, hypervisor="local", uptime=uptime)

    async def console_output(self, instance_uuid: UUID) -> bytes:
        guest = await asyncio.to_thread(self._guest, instance_uuid)
        return await asyncio.to_thread(read_tail, guest / CONSOLE_FILE)

    def _reboot(self, instance_uuid: UUID, hard: bool) -> None:
        current = self.power_state(instance_uuid)
        if not hard and current != RUNNING:
            LOG.info("guest %s is off: a soft reboot leaves it off", instance_uuid)
            return
        append_line(
            self.guest_dir(instance_uuid) / CONSOLE_FILE, f"{'hard' if hard else 'soft'} reboot"
        )
        self._set_power(instance_uuid, RUNNING, booted=True)

    def power_state(self, instance_uuid: UUID) -> str:
        """``running``, ``shutdown``, ``paused`` or ``suspended``; GuestNotFound if the guest
        does not exist."""
        guest = self._guest(instance_uuid)
        try:
            return (guest / POWER_FILE).read_text(encoding="ascii").strip() or RUNNING
        except FileNotFoundError:
            return RUNNING

    def _origin(self, instance_uuid: UUID) -> UUID | None:
        guest = self._guest(instance_uuid)
        try:
            spec = InstanceSpec.model_validate_json((guest / METADATA_FILE).read_bytes())
        except (OSError, ValueError):
            # A guest whose metadata is missing or unreadable was made by nobody keel
            # knows: no move may claim it as its own.
            return _UNKNOWN_ORIGIN
        return spec.origin

    def _guest(self, instance_uuid: UUID) -> Path:
        guest = self.guest_dir(instance_uuid)
        if not guest.is_dir():
            raise GuestNotFound(f"guest {instance_uuid} does not exist in {self.instances_dir}")
        return guest

    def _set_power(self, instance_uuid: UUID, state: str, *, booted: bool = False) -> None:
        """Record the guest's power state; its console shows a boot or a power-off."""
        guest = self._guest(instance_uuid)
        before = self.power_state(instance_uuid)
        scratch = guest / f".{POWER_FILE}.{secrets.token_hex(4)}"
        write_synced(scratch, f"{state}\n".encode())
        os.replace(scratch, guest / POWER_FILE)
        fsync_dir(guest)
        console = guest / CONSOLE_FILE
        if state == RUNNING and not booted and before in _WOKEN:
            append_line(console, _WOKEN[before])
        elif state == RUNNING and (booted or before != RUNNING):
            append_line(console, up_line(instance_uuid))
        elif state in _STOPPED_LINES and before != state:
            append_line(console, _STOPPED_LINES[state])
        LOG.info("guest %s is now %s", instance_uuid, state, extra=_extra(instance_uuid))

    def _sweep_scratch(self) -> list[str]:
        self.instances_dir.mkdir(parents=True, exist_ok=True)
        swept = []
        for entry in self.instances_dir.iterdir():
            if entry.name.startswith((_BUILDING, _DELETING)):
                shutil.rmtree(entry, ignore_errors=True)
                swept.append(entry.name)
        return swept

    def _measure(self) -> HypervisorResources:
        local_gb = self._local_gb
        if local_gb is None:
            local_gb = shutil.disk_usage(_nearest_existing(self.state_dir)).total // GIB
        return HypervisorResources(
            vcpus=self._vcpus or os.cpu_count() or 1,
            memory_mb=self._memory_mb or _total_memory_mb(),
            local_gb=local_gb,
            running_vms=len(self._list()),
        )

    def _list(self) -> list[UUID]:
        try:
            entries = list(self.instances_dir.iterdir())
        except FileNotFoundError:
            return []
        guests = []
        for entry in entries:
            try:
                instance_uuid = UUID(entry.name)
            except ValueError:
                continue
            if entry.is_dir():
                guests.append(instance_uuid)
        return guests

    def _spawn(self, spec: InstanceSpec) -> None:
        final = self.guest_dir(spec.uuid)
        if final.is_dir():
            LOG.info("guest directory %s already exists", final, extra=_extra(spec.uuid))
            return
        self.instances_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{_BUILDING}{spec.uuid}-", dir=self.instances_dir))
        try:
            try:
                _write_guest(scratch, spec, self._hostname)
            except OSError as exc:
                raise BuildFailed(
                    f"cannot write guest {spec.uuid} in {self.instances_dir}: {exc.strerror or exc}"
                ) from exc
            try:
                scratch.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
                LOG.info("guest %s was built concurrently; keeping that one", spec.uuid)
                return
            fsync_dir(self.instances_dir)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)
        LOG.info(
            "created guest directory %s with a %d GiB disk",
            final,
            spec.flavor.root_gb,
            extra=_extra(spec.uuid),
        )

    def _destroy(self, instance_uuid: UUID) -> None:
        if not self.instances_dir.is_dir():
            return
        final = self.guest_dir(instance_uuid)
        trash = self.instances_dir / f"{_DELETING}{instance_uuid}-{secrets.token_hex(4)}"
        try:
            final.rename(trash)
        except FileNotFoundError:
            pass
        else:
            fsync_dir(self.instances_dir)
            LOG.info("removed guest directory %s", final, extra=_extra(instance_uuid))
        for prefix in (_DELETING, _BUILDING):
            for leftover in self.instances_dir.glob(f"{prefix}{instance_uuid}-*"):
                shutil.rmtree(leftover)


def _write_guest(directory: Path, spec: InstanceSpec, hypervisor: str) -> None:
    os.chmod(directory, _GUEST_DIR_MODE)
    with (directory / DISK_FILE).open("xb") as disk:
        disk.truncate(spec.flavor.root_gb * GIB)
        os.fsync(disk.fileno())
    write_synced(directory / METADATA_FILE, spec.model_dump_json(indent=2).encode())
    write_synced(directory / POWER_FILE, f"{RUNNING}\n".encode())
    write_synced(directory / CONSOLE_FILE, boot_banner(spec, hypervisor).encode())
    fsync_dir(directory)


def _data_end(fd: int) -> int:
    """Where the file's last data ends: the start of its trailing hole (its size on a
    file system that keeps no holes)."""
    size = os.fstat(fd).st_size
    end, offset = 0, 0
    try:
        while offset < size:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            offset = os.lseek(fd, start, os.SEEK_HOLE)
            end = offset
    except OSError:  # ENXIO: no data after offset
        pass
    os.lseek(fd, 0, os.SEEK_SET)
    return min(end, size)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _total_memory_mb() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def _extra(instance_uuid: UUID) -> dict[str, str]:
    return {"instance_uuid": str(instance_uuid)}
