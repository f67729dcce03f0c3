"""limit and marker."""

from __future__ import annotations

import pytest

from services.api.http.faults import Fault
from services.api.http.paging import MAX_LIMIT, next_marker, page_request, take_page

ITEMS = ["a", "b", "c", "d", "e"]


def _key(item: str) -> str:
    return item


def test_no_limit_means_the_maximum() -> None:
    request = page_request(None, None)
    assert request.limit == MAX_LIMIT
    assert not request.limited
    assert take_page(ITEMS, request, _key) == ITEMS


def test_limit_and_marker() -> None:
    request = page_request("2", "b")
    page = take_page(ITEMS, request, _key)
    assert page == ["c", "d"]
    assert next_marker(page, request, _key) == "d"


def test_last_page_has_no_next_marker() -> None:
    request = page_request("2", "d")
    page = take_page(ITEMS, request, _key)
    assert page == ["e"]
    assert next_marker(page, request, _key) is None


def test_zero_limit_is_an_empty_page_and_huge_limits_are_capped() -> None:
    empty = page_request("0", None)
    assert take_page(ITEMS, empty, _key) == []
    assert next_marker([], empty, _key) is None
    assert page_request("100000", None).limit == MAX_LIMIT


@pytest.mark.parametrize("limit", ["x", "-1", "1.5"])
def test_bad_limit_is_400(limit: str) -> None:
    with pytest.raises(Fault) as caught:
        page_request(limit, None)
    assert caught.value.code == 400


def test_unknown_marker_is_400() -> None:
    with pytest.raises(Fault) as caught:
        take_page(ITEMS, page_request("2", "zzz"), _key)
    assert caught.value.code == 400
    assert caught.value.message == "marker [zzz] not found"
