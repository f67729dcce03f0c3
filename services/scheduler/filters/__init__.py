"""Scheduler filters, one per module; :func:`default_filters` is the set keel runs."""

from __future__ import annotations

from services.scheduler.filters.aggregate_extra_specs import AggregateInstanceExtraSpecsFilter
from services.scheduler.filters.aggregate_tenancy import AggregateMultiTenancyIsolation
from services.scheduler.filters.availability_zone import AvailabilityZoneFilter
from services.scheduler.filters.base import HostFilter
from services.scheduler.filters.compute import ComputeFilter
from services.scheduler.filters.disk import DiskFilter
from services.scheduler.filters.ignore_hosts import IgnoreHostsFilter
from services.scheduler.filters.ram import RamFilter
from services.scheduler.filters.requested_destination import RequestedDestinationFilter
from services.scheduler.filters.server_group import ServerGroupFilter
from services.scheduler.filters.vcpus import VcpuFilter

__all__ = [
    "AggregateInstanceExtraSpecsFilter",
    "AggregateMultiTenancyIsolation",
    "AvailabilityZoneFilter",
    "ComputeFilter",
    "DiskFilter",
    "HostFilter",
    "IgnoreHostsFilter",
    "RamFilter",
    "RequestedDestinationFilter",
    "ServerGroupFilter",
    "VcpuFilter",
    "default_filters",
]


def default_filters() -> list[HostFilter]:
    """The filters every request passes through, cheapest first.

    RequestedDestinationFilter comes first: it is the one a forced destination keeps.
    """
    return [
        RequestedDestinationFilter(),
        ComputeFilter(),
        IgnoreHostsFilter(),
        AvailabilityZoneFilter(),
        AggregateMultiTenancyIsolation(),
        AggregateInstanceExtraSpecsFilter(),
        VcpuFilter(),
        RamFilter(),
        DiskFilter(),
        ServerGroupFilter(),
    ]
