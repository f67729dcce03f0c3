"""Microversion parsing and negotiation."""

from __future__ import annotations

import pytest

from services.api.http import microversion
from services.api.http.faults import Fault
from services.api.http.microversion import MAX_VERSION, MIN_VERSION, APIVersion


def test_max_version_is_2_73() -> None:
    assert str(MAX_VERSION) == "2.104"
    assert str(MIN_VERSION) == "2.1"


@pytest.mark.parametrize(
    ("text", "expected"), [("2.1", (2, 1)), ("2.53", (2, 53)), (" 2.0 ", (2, 0))]
)
def test_parse(text: str, expected: tuple[int, int]) -> None:
    assert APIVersion.parse(text) == APIVersion(*expected)


@pytest.mark.parametrize("text", ["2", "2.x", "v2.1", "2.01", "02.1", "2.1.1", "", "latest"])
def test_parse_rejects_malformed_versions_with_400(text: str) -> None:
    with pytest.raises(Fault) as caught:
        APIVersion.parse(text)
    assert caught.value.code == 400
    assert "invalid format" in caught.value.message


def test_versions_order_numerically() -> None:
    assert APIVersion(2, 9) < APIVersion(2, 10) < APIVersion(2, 100)
    assert APIVersion(2, 47).at_least("2.47")
    assert not APIVersion(2, 46).at_least("2.47")


def test_new_header_wins_over_legacy() -> None:
    assert microversion.requested(["compute 2.53"], ["2.10"]) == "2.53"


def test_legacy_header_is_used_alone() -> None:
    assert microversion.requested([], ["2.10"]) == "2.10"


def test_new_header_naming_other_services_only_is_ignored() -> None:
    assert microversion.requested(["image 2.5"], []) is None
    assert microversion.requested(["image 2.5, Compute 2.20"], []) == "2.20"


def test_no_header_means_minimum() -> None:
    assert microversion.negotiate(None) == MIN_VERSION


@pytest.mark.parametrize("text", ["latest", "LATEST"])
def test_latest_means_maximum(text: str) -> None:
    assert microversion.negotiate(text) == MAX_VERSION


@pytest.mark.parametrize("text", ["2.0", f"2.{MAX_VERSION.minor + 1}", "3.0", "1.1"])
def test_out_of_range_is_406(text: str) -> None:
    with pytest.raises(Fault) as caught:
        microversion.negotiate(text)
    assert caught.value.code == 406
    assert f"Minimum is 2.1 and maximum is {MAX_VERSION}" in caught.value.message


def test_every_version_in_range_is_accepted() -> None:
    for minor in range(1, MAX_VERSION.minor + 1):
        assert microversion.negotiate(f"2.{minor}") == APIVersion(2, minor)


def test_response_headers_name_the_version_both_ways() -> None:
    headers = dict(microversion.response_headers(APIVersion(2, 53)))
    assert headers["OpenStack-API-Version"] == "compute 2.53"
    assert headers["X-OpenStack-Nova-API-Version"] == "2.53"
    assert "OpenStack-API-Version" in headers["Vary"]
    assert "X-OpenStack-Nova-API-Version" in headers["Vary"]


def test_a_version_with_too_many_digits_is_406_without_converting_it() -> None:
    with pytest.raises(Fault) as caught:
        microversion.negotiate("2." + "9" * 10_000)
    assert caught.value.code == 406
    assert len(caught.value.message) < 200


def test_a_long_malformed_version_is_400_with_a_bounded_message() -> None:
    with pytest.raises(Fault) as caught:
        microversion.negotiate("2." + "9" * 10_000 + "x")
    assert caught.value.code == 400
    assert len(caught.value.message) < 200
