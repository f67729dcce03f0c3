"""What a subnet create asks for: its range, gateway and the addresses servers get."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from services.api.network.managed import subnet_request
from services.api.network.routes import NeutronError

IP = ipaddress.IPv4Address


def test_the_gateway_is_the_first_host_and_servers_get_the_rest() -> None:
    cidr, gateway, first, last = subnet_request({"cidr": "10.1.0.0/24", "ip_version": 4})
    assert (str(cidr), gateway, first, last) == (
        "10.1.0.0/24",
        IP("10.1.0.1"),
        IP("10.1.0.2"),
        IP("10.1.0.254"),
    )


def test_a_gateway_at_the_end_or_none_leaves_the_start_to_servers() -> None:
    _, gateway, first, last = subnet_request({"cidr": "10.1.0.0/29", "gateway_ip": "10.1.0.6"})
    assert (gateway, first, last) == (IP("10.1.0.6"), IP("10.1.0.1"), IP("10.1.0.5"))
    _, gateway, first, last = subnet_request({"cidr": "10.1.0.0/29", "gateway_ip": None})
    assert (gateway, first, last) == (None, IP("10.1.0.1"), IP("10.1.0.6"))


def test_one_allocation_pool_sets_the_range() -> None:
    pools = [{"start": "10.1.0.10", "end": "10.1.0.20"}]
    _, _, first, last = subnet_request({"cidr": "10.1.0.0/24", "allocation_pools": pools})
    assert (first, last) == (IP("10.1.0.10"), IP("10.1.0.20"))


@pytest.mark.parametrize(
    "given",
    [
        {"cidr": "10.1.0.0/24", "allocation_pools": [{"start": "10.1.0.9", "end": "10.1.0.3"}]},
        {"cidr": "10.1.0.0/24", "allocation_pools": [{"start": "a", "end": "b"}] * 2},
        {"cidr": "10.1.0.0/24", "gateway_ip": "10.1.0.0"},
        {"cidr": "10.1.0.0/24", "enable_dhcp": False},
        {"cidr": "10.1.0.0/24", "subnetpool_id": "x"},
        {"cidr": "10.1.0.0/31"},
        {"cidr": 24},
    ],
)
def test_what_keel_cannot_make_is_a_400(given: dict[str, Any]) -> None:
    with pytest.raises(NeutronError) as refused:
        subnet_request(given)
    assert refused.value.status == 400
