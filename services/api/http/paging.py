"""``limit`` and ``marker``: pages of a list, as the compute API pages them.

A page holds at most ``limit`` items (never more than ``max_limit``, the
``KEEL_API__MAX_LIMIT`` setting, :data:`MAX_LIMIT` by default) following the item whose id
is ``marker``. ``limit=0`` asks for an empty page. An unknown marker is a 400, as in
Nova.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from services.api.http.faults import BadRequest

MAX_LIMIT = 1000

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    limit: int
    marker: str | None = None
    #: True if the client gave a limit (and so may ask for the next page).
    limited: bool = False


def page_request(
    limit: str | None, marker: str | None, *, max_limit: int = MAX_LIMIT
) -> PageRequest:
    """Read ``limit`` and ``marker`` query parameters; a bad limit is a 400."""
    if limit is None or limit == "":
        return PageRequest(limit=max_limit, marker=marker or None)
    try:
        number = int(limit)
    except ValueError:
        raise BadRequest("limit param must be an integer") from None
    if number < 0:
        raise BadRequest("limit param must be positive")
    # limit=0 is an empty page, as in Nova.
    return PageRequest(limit=min(number, max_limit), marker=marker or None, limited=True)


def marker_not_found(marker: str) -> BadRequest:
    return BadRequest(f"marker [{marker}] not found")


def take_page(items: Sequence[T], request: PageRequest, key: Callable[[T], str]) -> list[T]:
    """The items after the marker, at most ``request.limit`` of them."""
    start = 0
    if request.marker is not None:
        for index, item in enumerate(items):
            if key(item) == request.marker:
                start = index + 1
                break
        else:
            raise marker_not_found(request.marker)
    return list(items[start : start + request.limit])


def next_marker(page: Sequence[T], request: PageRequest, key: Callable[[T], str]) -> str | None:
    """The marker of the next page if this page is full, else ``None``."""
    if page and len(page) >= request.limit:
        return key(page[-1])
    return None
