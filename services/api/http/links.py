"""The URLs the API hands out, built from the address the client used to reach it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMPUTE_ROOT = "v2.1"


@dataclass(frozen=True)
class Links:
    """Absolute links under ``base`` (scheme, host and any mount prefix)."""

    base: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", self.base.rstrip("/"))

    def compute(self, *parts: str) -> str:
        """A versioned compute URL, e.g. ``http://host/v2.1/servers/ID``."""
        return "/".join((self.base, COMPUTE_ROOT, *parts))

    def bookmark(self, *parts: str) -> str:
        """An unversioned compute URL, as Nova's ``bookmark`` links are."""
        return "/".join((self.base, *parts))

    def resource(self, collection: str, resource_id: str) -> list[dict[str, Any]]:
        """The ``self`` and ``bookmark`` links of one resource."""
        return [
            {"rel": "self", "href": self.compute(collection, resource_id)},
            {"rel": "bookmark", "href": self.bookmark(collection, resource_id)},
        ]
