"""RPC version parsing and the compatibility rule; service version history."""

from __future__ import annotations

import re

import pytest

from shared.versions import (
    RELEASE_NAMES,
    SERVICE_VERSION,
    SERVICE_VERSION_HISTORY,
    ReleaseApis,
    apis_for,
    is_compatible,
    parse_version,
)
from tests.docs import page


@pytest.mark.parametrize(
    ("text", "parsed"), [("1.0", (1, 0)), ("1.12", (1, 12)), ("10.3", (10, 3)), ("0.0", (0, 0))]
)
def test_parse_version(text: str, parsed: tuple[int, int]) -> None:
    assert parse_version(text) == parsed


@pytest.mark.parametrize("text", ["", "1", "1.", ".1", "a.b", "1.2.3", "v1.0", "-1.0", "1.-1"])
def test_malformed_version_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        parse_version(text)


@pytest.mark.parametrize(
    ("requested", "served", "compatible"),
    [
        ("1.0", "1.2", True),
        ("1.2", "1.2", True),
        ("1.3", "1.2", False),
        ("2.0", "1.2", False),
        ("1.0", "2.0", False),
        ("1.9", "1.10", True),
        ("1.10", "1.9", False),
    ],
)
def test_same_major_and_no_higher_minor(requested: str, served: str, compatible: bool) -> None:
    assert is_compatible(requested, served) is compatible


def test_compatibility_refuses_malformed_versions() -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        is_compatible("1", "1.0")


def test_current_service_version_has_apis() -> None:
    assert len(SERVICE_VERSION_HISTORY) == SERVICE_VERSION + 1
    apis = apis_for(SERVICE_VERSION)
    for version in (apis.compute, apis.conductor, apis.scheduler):
        parse_version(version)


@pytest.mark.parametrize("version", [0, -1, SERVICE_VERSION + 1])
def test_unknown_service_version_is_refused(version: int) -> None:
    with pytest.raises(ValueError, match="unknown service version"):
        apis_for(version)


def test_the_guide_lists_every_release_with_the_rpc_versions_it_speaks() -> None:
    upgrades = page("upgrades.md")
    rows = re.findall(
        r"^\| (\d+) `(\w+)` \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d+) \|", upgrades, re.MULTILINE
    )
    documented = {
        int(number): (name, ReleaseApis(compute=compute, conductor=conductor, scheduler=sched))
        for number, name, compute, conductor, sched in rows
    }
    names = {number: name for name, number in RELEASE_NAMES.items()}
    expected = {
        number: (names[number], apis)
        for number, apis in enumerate(SERVICE_VERSION_HISTORY)
        if apis is not None
    }
    assert documented == expected
