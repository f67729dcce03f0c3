"""The flavor extra specs checked from 2.86: known keys, their values, known namespaces."""

from __future__ import annotations

import pytest

from services.api.http.faults import Fault
from services.api.resources.extra_spec_rules import RULES, check


def refusal(name: str, value: str) -> str:
    with pytest.raises(Fault) as caught:
        check(name, value)
    assert caught.value.code == 400
    return caught.value.message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("hw:cpu_policy", "dedicated"),
        ("hw:numa_nodes", "2"),
        ("hw:numa_cpus.0", "0-3,^2"),
        ("hw:numa_mem.1", "1024"),
        ("hw:mem_page_size", "2MB"),
        ("hw:cpu_realtime", "Yes"),
        ("hw_rng:allowed", "false"),
        ("resources:VCPU", "2"),
        ("resources1:CUSTOM_GPU", "1"),
        ("trait:HW_CPU_X86_AVX2", "required"),
        ("trait_fast:CUSTOM_FAST_DISK", "forbidden"),
        ("aggregate_instance_extra_specs:ssd", "true"),
        ("capabilities:cpu_info:features", "<in> avx"),
        ("quota:cpu_reservation", "-5"),
        ("group_policy", "isolate"),
        # Keys outside every known namespace are not checked.
        ("keel:anything", "at all"),
        ("color", "blue"),
    ],
)
def test_known_values_and_unknown_namespaces_are_accepted(name: str, value: str) -> None:
    check(name, value)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("hw:cpu_policy", "sometimes", "'sometimes' is not one of: dedicated, shared, mixed."),
        ("hw:numa_nodes", "0", "'0' is less than the min value of '1'."),
        ("hw:redirected_usb_ports", "16", "'16' is greater than the max value of '15'."),
        ("hw:numa_nodes", "two", "'two' is not a valid integer value."),
        ("hw:cpu_realtime", "maybe", "'maybe' is not a valid boolean-like value."),
        ("hw:numa_cpus.0", "a-b", "'a-b' is not of the format"),
        ("trait:HW_CPU_X86_AVX2", "wanted", "'wanted' is not one of: required, forbidden."),
        ("hw:cpu_polcy", "dedicated", "extra spec 'hw:cpu_polcy' does not appear to be a valid"),
        ("trait:NOT_A_TRAIT", "required", "extra spec 'trait:NOT_A_TRAIT' does not appear"),
        ("resources2:DISK", "1", "extra spec 'resources2:DISK' does not appear"),
        ("os:secure_boot", "optional", "'optional' is not one of: disabled, required."),
    ],
)
def test_bad_values_and_unknown_keys_in_known_namespaces_are_400(
    name: str, value: str, message: str
) -> None:
    found = refusal(name, value)
    assert found.startswith("Validation failed; ")
    assert message in found


def test_the_standard_traits_and_resource_classes_are_known() -> None:
    assert "trait{group}:COMPUTE_STATUS_DISABLED" in RULES
    assert "resources{group}:MEMORY_MB" in RULES
