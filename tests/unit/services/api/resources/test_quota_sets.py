"""Quota arithmetic and the validation of quota updates, without a database."""

from __future__ import annotations

import pytest

from services.api.http.faults import BadRequest
from services.api.http.microversion import APIVersion
from services.api.resources.quota_sets import parse_update, resources_at
from services.api.resources.quotas import check_metadata_items, defaults
from shared.config import QuotaSettings
from shared.exceptions import OverQuota

V2_57 = APIVersion(2, 57)


def test_the_message_names_every_resource_over_its_limit() -> None:
    error = OverQuota.exceeded(["instances"], [1], [3], [3])
    assert (
        error.message
        == "Quota exceeded for instances: Requested 1, but already used 3 of 3 instances"
    )
    two = OverQuota.exceeded(["cores", "ram"], [2, 512], [19, 51000], [20, 51200])
    assert two.message == (
        "Quota exceeded for cores, ram: Requested 2, 512, but already used 19, 51000 of "
        "20, 51200 cores, ram"
    )


def test_defaults_come_from_the_settings() -> None:
    found = defaults(QuotaSettings(instances=4, ram=-1))
    assert (found["instances"], found["ram"], found["cores"]) == (4, -1, 20)
    assert found["server_groups"] == 10


def test_metadata_items_are_limited_per_server() -> None:
    check_metadata_items({"metadata_items": 2}, 2)
    check_metadata_items({"metadata_items": -1}, 10_000)
    with pytest.raises(OverQuota, match="Maximum number of metadata items exceeds 2"):
        check_metadata_items({"metadata_items": 2}, 3)


def test_resources_follow_the_microversion() -> None:
    assert "injected_files" in resources_at(APIVersion(2, 56))
    assert "injected_files" not in resources_at(V2_57)
    assert "instances" in resources_at(APIVersion(2, 1))


def test_a_valid_update() -> None:
    values, force = parse_update(
        {"quota_set": {"instances": 3, "cores": "-1", "force": True}}, V2_57
    )
    assert values == {"instances": 3, "cores": -1}
    assert force is True
    assert parse_update({"quota_set": {}}, V2_57) == ({}, False)


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"quota": {"instances": 1}},
        {"quota_set": {"instances": 1}, "extra": 1},
        {"quota_set": "instances=1"},
        {"quota_set": {"instances": -2}},
        {"quota_set": {"instances": "-3"}},
        {"quota_set": {"instances": 2**31}},
        {"quota_set": {"instances": None}},
        {"quota_set": {"instances": False}},
        {"quota_set": {"instances": "1e3"}},
        {"quota_set": {"unknown": 1}},
        {"quota_set": {"injected_files": 1}},
        {"quota_set": {"force": "maybe"}},
    ],
)
def test_invalid_updates_are_400(body: object) -> None:
    with pytest.raises(BadRequest):
        parse_update(body, V2_57)
