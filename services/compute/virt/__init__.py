"""Virt drivers of keel-compute, behind one protocol (:mod:`.driver`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.compute.virt.driver import Driver, HypervisorResources
from services.compute.virt.fake import FakeDriver
from services.compute.virt.local import LocalDriver
from services.compute.virt.rehearsal import RehearsalDriver
from shared.config import Settings

if TYPE_CHECKING:
    from services.compute.virt.libvirt.metadata_relay import MetadataRelay

__all__ = [
    "Driver",
    "FakeDriver",
    "HypervisorResources",
    "LocalDriver",
    "RehearsalDriver",
    "load_driver",
]


def load_driver(settings: Settings) -> Driver:
    """The driver ``settings.compute.driver`` names, sized by ``settings.compute``.

    With rehearsal settings (``KEEL_VIRT__*``) it is wrapped to fail or delay operations.
    """
    driver = base_driver(settings)
    virt = settings.virt
    if virt.failing or virt.delay_s:
        return RehearsalDriver(driver, fail=virt.failing, delay=virt.delay_s)
    return driver


def base_driver(settings: Settings) -> Driver:
    """The driver ``settings.compute.driver`` names, as it is (no rehearsal wrapper)."""
    compute = settings.compute
    if compute.driver == "libvirt":
        return _libvirt_driver(settings)
    if compute.driver == "fake":
        return FakeDriver(
            settings.hypervisor_hostname,
            vcpus=compute.vcpus or FakeDriver.DEFAULT_VCPUS,
            memory_mb=compute.memory_mb or FakeDriver.DEFAULT_MEMORY_MB,
            local_gb=compute.local_gb or FakeDriver.DEFAULT_LOCAL_GB,
        )
    return LocalDriver(
        settings.state_dir,
        settings.hypervisor_hostname,
        vcpus=compute.vcpus,
        memory_mb=compute.memory_mb,
        local_gb=compute.local_gb,
    )


def metadata_relay(settings: Settings) -> MetadataRelay | None:
    """The libvirt driver's metadata relay, when agents are told the metadata service."""
    from services.compute.virt.libvirt.metadata_relay import MetadataRelay  # noqa: PLC0415

    metadata = settings.metadata
    if metadata.url is None or metadata.secret is None:
        return None
    return MetadataRelay(settings.state_dir, metadata.url, metadata.secret)


def _libvirt_driver(settings: Settings) -> Driver:
    """The libvirt driver; imported only when chosen (its binding is an optional extra)."""
    from services.compute.image_cache import ImageCache  # noqa: PLC0415
    from services.compute.virt.libvirt.connection import LibvirtConnection  # noqa: PLC0415
    from services.compute.virt.libvirt.driver import LibvirtDriver  # noqa: PLC0415
    from services.compute.virt.libvirt.interface import NetworkConfig  # noqa: PLC0415
    from services.compute.virt.libvirt.migration import MigrationConfig  # noqa: PLC0415

    compute, libvirt = settings.compute, settings.libvirt
    cache = ImageCache(
        settings.state_dir / "image-cache", cap_bytes=int(compute.image_cache_gb * 1024**3)
    )
    return LibvirtDriver(
        LibvirtConnection(libvirt.uri),
        state_dir=settings.state_dir,
        cache=cache,
        domain_type=libvirt.domain_type,
        hypervisor_hostname=compute.hypervisor_hostname,
        fallback_hostname=settings.host,
        shutdown_timeout=libvirt.shutdown_timeout,
        vcpus=compute.vcpus,
        memory_mb=compute.memory_mb,
        local_gb=compute.local_gb,
        network=NetworkConfig(
            mode=libvirt.network, bridge=libvirt.bridge, ssh_forward_port=libvirt.ssh_forward_port
        ),
        force_config_drive=libvirt.force_config_drive,
        metadata=metadata_relay(settings),
        migration=MigrationConfig(
            uri=libvirt.migration_uri or libvirt.uri,
            address=libvirt.migration_address,
            bandwidth_mib=libvirt.migration_bandwidth_mib,
            auto_converge=libvirt.migration_auto_converge,
        ),
    )
