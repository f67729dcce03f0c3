"""Flavor bodies across microversions."""

from __future__ import annotations

from services.api.http.links import Links
from services.api.http.microversion import APIVersion
from services.api.views.flavors import flavor_detail, flavor_summary
from tests.unit.services.api.factories import flavor

LINKS = Links("http://api.example")


def test_summary_at_2_1() -> None:
    body = flavor_summary(flavor(), APIVersion(2, 1), LINKS)
    assert body == {
        "id": "1",
        "name": "m1.tiny",
        "links": [
            {"rel": "self", "href": "http://api.example/v2.1/flavors/1"},
            {"rel": "bookmark", "href": "http://api.example/flavors/1"},
        ],
    }


def test_detail_at_2_1() -> None:
    body = flavor_detail(flavor(), APIVersion(2, 1), LINKS)
    assert body["ram"] == 512
    assert body["disk"] == 1
    assert body["OS-FLV-EXT-DATA:ephemeral"] == 0
    assert body["OS-FLV-DISABLED:disabled"] is False
    assert body["os-flavor-access:is_public"] is True
    assert body["swap"] == ""
    assert "description" not in body
    assert "extra_specs" not in body


def test_swap_is_a_number_when_set() -> None:
    assert flavor_detail(flavor(swap=512), APIVersion(2, 1), LINKS)["swap"] == 512


def test_description_from_2_55_and_extra_specs_from_2_61() -> None:
    at_55 = flavor_detail(flavor(), APIVersion(2, 55), LINKS)
    assert at_55["description"] == "small"
    assert "extra_specs" not in at_55
    assert flavor_summary(flavor(), APIVersion(2, 55), LINKS)["description"] == "small"
    at_61 = flavor_detail(flavor(), APIVersion(2, 61), LINKS)
    assert at_61["extra_specs"] == {"hw:cpu_policy": "shared"}


def test_no_swap_is_0_from_2_75() -> None:
    assert flavor_detail(flavor(), APIVersion(2, 74), LINKS)["swap"] == ""
    assert flavor_detail(flavor(), APIVersion(2, 75), LINKS)["swap"] == 0
