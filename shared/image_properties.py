"""The image properties a server keeps from its image (shown from compute microversion 2.98).

When a server is created it keeps the properties of its image that Nova's image model
knows (``hw_*``, ``img_*``, ``os_*`` and their legacy names), each as text of at most 255
characters, as Nova keeps them in the instance's system metadata: what the image said
when the server was made, even if the image changes or goes later. Other properties
(``owner_specified.*``, a user's own keys) are not kept.
"""

from __future__ import annotations

from collections.abc import Mapping

_HW = (
    "architecture emulation_architecture auto_disk_config boot_menu cdrom_bus cpu_cores "
    "cpu_sockets cpu_max_cores cpu_max_sockets cpu_max_threads cpu_policy cpu_thread_policy "
    "cpu_realtime_mask cpu_threads device_id disk_bus disk_type floppy_bus firmware_type "
    "firmware_stateless input_bus ipxe_boot locked_memory machine_type mem_encryption "
    "mem_encryption_model mem_page_size numa_nodes numa_cpus numa_mem "
    "pci_numa_affinity_policy pointer_model pmu qemu_guest_agent rescue_bus rescue_device "
    "rng_model time_hpet serial_port_count scsi_model video_model video_ram vif_model "
    "viommu_model vm_mode watchdog_action vif_multiqueue_enabled tpm_model tpm_version "
    "ephemeral_encryption ephemeral_encryption_format ephemeral_encryption_secret_uuid "
    "virtio_packed_ring maxphysaddr_mode maxphysaddr_bits sound_model usb_model "
    "redirected_usb_ports"
)
_IMG = (
    "bittorrent bdm_v2 block_device_mapping cache_in_nova compression_level "
    "hv_requested_version hv_type config_drive linked_clone mappings owner_id "
    "root_device_name use_agent version signature signature_hash_method "
    "signature_certificate_uuid signature_key_type hide_hypervisor_id"
)
_OS = (
    "admin_user command_line distro require_quiesce secure_boot "
    "skip_agent_inject_files_at_boot skip_agent_inject_ssh type"
)
#: Names older images use for some of the above.
_LEGACY = (
    "architecture owner_id vmware_disktype vmware_image_version vmware_ostype "
    "auto_disk_config ipxe_boot xenapi_device_id xenapi_image_compression_level "
    "vmware_linked_clone xenapi_use_agent xenapi_skip_agent_inject_ssh "
    "xenapi_skip_agent_inject_files_at_boot cache_in_nova vm_mode bittorrent mappings "
    "block_device_mapping bdm_v2 root_device_name hypervisor_version_requires "
    "hypervisor_type"
)

#: Every property name a server keeps.
STANDARD: frozenset[str] = frozenset(
    [f"hw_{name}" for name in _HW.split()]
    + [f"img_{name}" for name in _IMG.split()]
    + [f"os_{name}" for name in _OS.split()]
    + ["traits_required"]
    + _LEGACY.split()
)
#: The longest value kept, as Nova's system metadata keeps it.
MAX_VALUE = 255


def kept(properties: Mapping[str, object]) -> dict[str, str]:
    """What a new server keeps of its image's ``properties``."""
    return {name: str(value)[:MAX_VALUE] for name, value in properties.items() if name in STANDARD}
