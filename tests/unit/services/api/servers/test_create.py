"""The create request: what is accepted, what is refused before touching anything."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.api.http.faults import Fault
from services.api.servers.create import NewServerBody, check_fits, counts
from services.api.servers.fields import AddressRequest, PreparedFields
from services.api.servers.lookup import last_segment
from shared.config import NetworkSettings
from tests.unit.services.api.factories import flavor, image

BASE: dict[str, Any] = {"name": "web-1", "imageRef": "11111111-2222-3333-4444-555555555555"}


def parse(**server: Any) -> NewServerBody:
    return NewServerBody.model_validate({"server": {**BASE, "flavorRef": "1", **server}})


def test_what_the_openstack_client_sends_is_accepted() -> None:
    body = parse(
        networks="auto",
        min_count=1,
        max_count=1,
        block_device_mapping_v2=[{"boot_index": 0, "uuid": BASE["imageRef"]}],
    )
    assert body.server.name == "web-1"
    assert body.server.networks == "auto"


def test_flavor_ref_may_be_a_number_or_a_link() -> None:
    assert parse(flavorRef=3).server.flavor_ref == "3"
    assert last_segment(parse(flavorRef="http://api/v2.1/flavors/3/").server.flavor_ref) == "3"


@pytest.mark.parametrize(
    "changes",
    [
        {"name": ""},
        {"name": " padded"},
        {"name": "tab\there"},
        {"name": None},
        {"networks": 5},
        {"networks": [5]},
        {"min_count": 0},
        {"min_count": 2.5},
        {"max_count": 0},
        {"max_count": "two"},
        {"max_count": True},
        {"min_count": "-1"},
        {"flavorRef": True},
        {"flavorRef": ""},
    ],
)
def test_bad_fields_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse(**changes)


FIELDS = PreparedFields(network=NetworkSettings())


def test_counts_as_nova_reads_them() -> None:
    assert counts(parse().server, FIELDS) == (1, 1)
    assert counts(parse(min_count=3).server, FIELDS) == (3, 3)
    assert counts(parse(max_count=3).server, FIELDS) == (1, 3)
    assert counts(parse(min_count="2", max_count="4").server, FIELDS) == (2, 4)
    with pytest.raises(Fault) as caught:
        counts(parse(min_count=3, max_count=2).server, FIELDS)
    assert caught.value.code == 400
    assert caught.value.message == "min_count must be <= max_count"


def test_several_servers_cannot_share_one_fixed_address() -> None:
    fixed = PreparedFields(network=NetworkSettings(), addresses=[AddressRequest("10.0.0.9")])
    assert counts(parse().server, fixed) == (1, 1)
    with pytest.raises(Fault, match="multiple instances"):
        counts(parse(max_count=2).server, fixed)


def test_image_minimums_must_fit_the_flavor() -> None:
    check_fits(flavor(memory_mb=512, root_gb=1), image(min_ram=512, min_disk=1))
    with pytest.raises(Fault, match="memory is too small"):
        check_fits(flavor(memory_mb=256), image(min_ram=512))
    with pytest.raises(Fault, match="disk is too small"):
        check_fits(flavor(root_gb=1), image(min_disk=2, min_ram=0))
    check_fits(flavor(root_gb=0), image(min_disk=20, min_ram=0))
