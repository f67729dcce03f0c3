"""The flavor extra specs Nova knows, and what each may be: checked from microversion 2.86.

From 2.86 ``POST /flavors/{id}/os-extra_specs`` and ``PUT .../os-extra_specs/{key}``
refuse with 400 a spec that names a known key with a value it cannot take
(``hw:cpu_policy=sometimes``), and a key in a known namespace that names nothing
(``hw:cpu_polcy``): a typo there would otherwise be stored and silently do nothing.
Keys outside the known namespaces (``keel:anything``, ``color``) are kept unchecked, as
Nova keeps them. keel's scheduler reads few of these specs; the list is Nova's so that a
flavor written for Nova is judged the same here, at any microversion a client picks.

The standard trait and resource class names come from the ``os-traits`` and
``os-resource-classes`` libraries, the lists Nova and Placement use.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import os_resource_classes
import os_traits

from services.api.http.faults import BadRequest

#: The first microversion that checks extra specs.
VALIDATION_VERSION = "2.86"

Kind = Literal["str", "int", "bool"]

_TRUE = {"1", "t", "true", "on", "y", "yes"}
_FALSE = {"0", "f", "false", "off", "n", "no"}
#: A request group's suffix, as in ``resources1:VCPU`` or ``trait_fast:HW_CPU_X86_AVX``.
_GROUP = r"([a-zA-Z0-9_-]{1,64})?"
#: A list of CPU numbers and ranges, each perhaps excluded: ``0-3,^2``.
_CPU_SET = r"\^?\d+((-\d+)?(,\^?\d+(-\d+)?)?)*"


def _failed(text: str) -> BadRequest:
    return BadRequest(f"Validation failed; {text}")


@dataclass(frozen=True)
class Rule:
    """One known extra spec: its name (``{param}`` stands for a part that varies) and
    the values it takes."""

    name: str
    kind: Kind = "str"
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    #: What each ``{param}`` of the name matches.
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def name_pattern(self) -> str:
        pattern = self.name
        for param, matches in self.params.items():
            pattern = pattern.replace(f"{{{param}}}", f"(?P<{param}>{matches})")
        return pattern

    def check(self, value: str) -> None:
        """400 unless ``value`` is one this spec takes."""
        if self.kind == "int":
            self._check_int(value)
        elif self.kind == "bool":
            if value.strip().lower() not in _TRUE | _FALSE:
                raise _failed(f"'{value}' is not a valid boolean-like value.")
        elif self.pattern is not None:
            if re.fullmatch(self.pattern, value) is None:
                raise _failed(f"'{value}' is not of the format '{self.pattern}'.")
        elif self.choices and value not in self.choices:
            raise _failed(f"'{value}' is not one of: {', '.join(self.choices)}.")

    def _check_int(self, value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise _failed(f"'{value}' is not a valid integer value.") from None
        if self.maximum is not None and number > self.maximum:
            raise _failed(f"'{number}' is greater than the max value of '{self.maximum}'.")
        if self.minimum is not None and number < self.minimum:
            raise _failed(f"'{number}' is less than the min value of '{self.minimum}'.")


def _many(
    namespace: str, names: str, kind: Kind = "str", minimum: int | None = None
) -> Iterator[Rule]:
    """A rule for each of the space-separated ``names`` in ``namespace``."""
    for name in names.split():
        yield Rule(f"{namespace}:{name}", kind=kind, minimum=minimum)


def _enum(name: str, *choices: str) -> Rule:
    return Rule(name, choices=choices)


def _capabilities() -> Iterator[Rule]:
    """What the ComputeCapabilitiesFilter compares: any text."""
    plain = (
        "id uuid service_id host vcpus memory_mb local_gb vcpus_used memory_mb_used "
        "local_gb_used hypervisor_type hypervisor_version hypervisor_hostname free_ram_mb "
        "free_disk_gb current_workload running_vms disk_available_least host_ip mapped "
        "cpu_allocation_ratio ram_allocation_ratio disk_allocation_ratio total_usable_ram_mb "
        "total_usable_disk_gb disk_mb_used free_disk_mb vcpus_total num_instances num_io_ops "
        "failed_builds aggregates cell_uuid updated"
    )
    yield from _many("capabilities", plain)
    nested = (
        "cpu_info metrics stats numa_topology supported_hv_specs pci_device_pools nodename "
        "pci_stats supported_instances limits instances"
    )
    for name in nested.split():
        yield Rule(f"capabilities:{name}{{filter}}", params={"filter": r"(:\w+)*"})


def _hw() -> Iterator[Rule]:
    yield from _many(
        "hw",
        "cpu_realtime hide_hypervisor_id locked_memory boot_menu vif_multiqueue_enabled "
        "mem_encryption pmu virtio_packed_ring ephemeral_encryption",
        kind="bool",
    )
    yield from _many(
        "hw",
        "numa_nodes cpu_sockets cpu_cores cpu_threads cpu_max_sockets cpu_max_cores "
        "cpu_max_threads",
        kind="int",
        minimum=1,
    )
    yield Rule("hw:cpu_realtime_mask", pattern=r"(\^)?\d+((-\d+)?(,\^?\d+(-\d+)?)?)*")
    yield Rule("hw:cpu_dedicated_mask", pattern=_CPU_SET)
    yield Rule("hw:mem_page_size", pattern=r"(large|small|any|\d+([kKMGT]i?)?(b|bit|B)?)")
    yield Rule("hw:numa_cpus.{num}", pattern=_CPU_SET, params={"num": r"\d+"})
    yield Rule("hw:numa_mem.{num}", kind="int", minimum=1, params={"num": r"\d+"})
    yield Rule("hw:pmem", pattern=r"([a-zA-Z0-9_]+(,)?)+")
    yield Rule("hw:serial_port_count", kind="int", minimum=0)
    yield Rule("hw:redirected_usb_ports", kind="int", minimum=0, maximum=15)
    yield _enum("hw:cpu_policy", "dedicated", "shared", "mixed")
    yield _enum("hw:cpu_thread_policy", "prefer", "isolate", "require")
    yield _enum("hw:emulator_threads_policy", "isolate", "share")
    yield _enum("hw:pci_numa_affinity_policy", "required", "preferred", "legacy", "socket")
    yield _enum("hw:mem_encryption_model", "amd-sev", "amd-sev-es", "amd-sev-snp")
    yield _enum("hw:tpm_model", "tpm-tis", "tpm-crb")
    yield _enum("hw:tpm_version", "1.2", "2.0")
    yield _enum("hw:tpm_secret_security", "user", "host", "deployment")
    yield _enum("hw:watchdog_action", "none", "pause", "poweroff", "reset", "disabled")
    yield _enum("hw:viommu_model", "intel", "smmuv3", "virtio", "auto")
    yield _enum(
        "hw:sound_model", "sb16", "es1370", "pcspk", "ac97", "ich6", "ich9", "usb", "virtio"
    )
    yield _enum("hw:usb_model", "none", "nec-xhci", "qemu-xhci")
    yield _enum("hw:ephemeral_encryption_format", "plain", "luks", "luksv2")


def _quota() -> Iterator[Rule]:
    for resource in ("cpu", "memory", "disk_io", "vif"):
        yield Rule(f"quota:{resource}_limit", kind="int", minimum=0)
        yield Rule(f"quota:{resource}_reservation", kind="int")
        yield _enum(f"quota:{resource}_shares_level", "custom", "high", "normal", "low")
        yield Rule(f"quota:{resource}_shares_share", kind="int", minimum=0)
    yield Rule("quota:cpu_quota", kind="int")
    tuning = (
        "cpu_shares cpu_period disk_read_bytes_sec disk_read_iops_sec disk_write_bytes_sec "
        "disk_write_iops_sec disk_total_bytes_sec disk_total_iops_sec vif_inbound_average "
        "vif_inbound_peak vif_inbound_burst vif_outbound_average vif_outbound_peak "
        "vif_outbound_burst"
    )
    yield from _many("quota", tuning, kind="int", minimum=0)


def _placement() -> Iterator[Rule]:
    group = {"group": _GROUP}
    for resource_class in os_resource_classes.STANDARDS:
        yield Rule(f"resources{{group}}:{resource_class}", kind="int", params=group)
    yield Rule(
        "resources{group}:CUSTOM_{resource}",
        kind="int",
        params={**group, "resource": r"[A-Z0-9_]+"},
    )
    wanted = ("required", "forbidden")
    for trait in os_traits.get_traits():
        yield Rule(f"trait{{group}}:{trait}", choices=wanted, params=group)
    yield Rule(
        "trait{group}:CUSTOM_{trait}", choices=wanted, params={**group, "trait": r"[A-Z0-9_]+"}
    )


def _others() -> Iterator[Rule]:
    yield Rule("accel:device_profile")
    yield Rule("aggregate_instance_extra_specs:{key}", params={"key": ".+"})
    yield Rule("hw_rng:allowed", kind="bool")
    yield Rule("hw_rng:rate_bytes", kind="int", minimum=0)
    yield Rule("hw_rng:rate_period", kind="int", minimum=0)
    yield Rule("hw_video:ram_max_mb", kind="int", minimum=0)
    yield Rule("hide_hypervisor_id", kind="bool")
    yield _enum("group_policy", "isolate", "none")
    yield _enum("os:secure_boot", "disabled", "required")
    yield Rule("pci_passthrough:alias", pattern=r"[^:]+:\d+(?:\s*,\s*[^:]+:\d+)*")
    yield Rule("vmware:hw_version")
    yield Rule("vmware:storage_policy")


def _all_rules() -> list[Rule]:
    return [*_capabilities(), *_hw(), *_quota(), *_placement(), *_others()]


RULES: dict[str, Rule] = {rule.name: rule for rule in _all_rules()}
_PATTERNS = [(re.compile(rule.name_pattern), rule) for rule in RULES.values()]
#: The namespaces (the part of a key before its first ``:``) that hold known specs.
NAMESPACES = [
    re.compile(rule.name_pattern.split(":", 1)[0]) for rule in RULES.values() if ":" in rule.name
]


def check(name: str, value: str) -> None:
    """400 if the spec is a known one with a value it cannot take, or an unknown key in a
    known namespace; any other spec is accepted as it is."""
    rule = RULES.get(name)
    if rule is None:
        rule = next((r for pattern, r in _PATTERNS if pattern.fullmatch(name)), None)
    if rule is not None:
        rule.check(value)
        return
    if ":" not in name:
        return
    namespace = name.split(":", 1)[0]
    if any(pattern.fullmatch(namespace) for pattern in NAMESPACES):
        raise _failed(f"extra spec '{name}' does not appear to be a valid extra spec.")
