"""The ``migrate`` action's body as Nova's schema reads it, per microversion."""

from __future__ import annotations

from typing import Any

import pytest

from services.api.http.faults import BadRequest
from services.api.http.microversion import APIVersion
from services.api.servers.moves import migration_target as _target


@pytest.mark.parametrize("value", [None, {}, {"host": "compute2"}, "junk", [], {"other": 1}])
def test_below_2_56_any_value_is_taken_and_no_host_is_named(value: Any) -> None:
    assert _target(value, APIVersion(2, 55)) is None
    assert _target(value, APIVersion(2, 1)) is None


def test_from_2_56_a_host_is_named_and_the_body_checked() -> None:
    assert _target({"host": "compute2"}, APIVersion(2, 56)) == "compute2"
    assert _target({}, APIVersion(2, 56)) is None
    assert _target(None, APIVersion(2, 56)) is None
    bad: object
    for bad in ("junk", [], {"other": 1}, {"host": ""}):
        with pytest.raises(BadRequest):
            _target(bad, APIVersion(2, 56))
