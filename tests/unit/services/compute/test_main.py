"""keel-compute's start-up: settings it accepts only to say they are ignored."""

from __future__ import annotations

import logging

import pytest

from services.compute.main import warn_ignored_settings
from shared.config import Settings, WorkaroundSettings


@pytest.mark.parametrize("value", [True, False])
def test_destroy_after_evacuate_is_accepted_and_reported_as_ignored(
    caplog: pytest.LogCaptureFixture, value: bool
) -> None:
    settings = Settings(workarounds=WorkaroundSettings(destroy_after_evacuate=value))
    with caplog.at_level(logging.WARNING, logger="services.compute.main"):
        warn_ignored_settings(settings)
    assert [
        "DESTROY_AFTER_EVACUATE is deprecated and ignored" in r.message for r in caplog.records
    ] == [True]


def test_nothing_is_said_when_it_is_not_set(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="services.compute.main"):
        warn_ignored_settings(Settings())
    assert caplog.records == []
