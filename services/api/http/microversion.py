"""Compute API microversions: what a request asks for, and what the API can give.

A client names the version it wants in ``OpenStack-API-Version: compute X.Y`` or, the
older way, ``X-OpenStack-Nova-API-Version: X.Y`` (the first wins when both are sent).
No header means the minimum version, ``latest`` the maximum. A malformed version is a
400; a well-formed one outside ``[MIN_VERSION, MAX_VERSION]`` is a 406. Every response
names the version that was used, in both headers, with ``Vary`` on both.

To raise the maximum, change :data:`MAX_VERSION` (and only it) after making every
resource answer correctly at the new version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from services.api.http.faults import BadRequest, Fault, short

HEADER = "OpenStack-API-Version"
LEGACY_HEADER = "X-OpenStack-Nova-API-Version"
SERVICE_TYPE = "compute"

_FORMAT = re.compile(r"^([1-9]\d*)\.([1-9]\d*|0)$")
#: Digits a version number may have; a longer one is well-formed but never supported.
_MAX_DIGITS = 6


class NotAcceptable(Fault):
    def __init__(self, message: str) -> None:
        super().__init__(406, message)


@dataclass(frozen=True, order=True)
class APIVersion:
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Self:
        """``"2.53"`` → ``APIVersion(2, 53)``; a malformed string is a 400 fault."""
        match = _FORMAT.match(text.strip())
        if match is None:
            raise BadRequest(
                f"API Version String {short(text, 40)} is of invalid format. "
                "Must be of format MajorNum.MinorNum."
            )
        if max(len(match[1]), len(match[2])) > _MAX_DIGITS:
            raise NotAcceptable(
                f"Version {short(text.strip(), 40)} is not supported by the API. "
                f"Minimum is {MIN_VERSION} and maximum is {MAX_VERSION}."
            )
        return cls(int(match[1]), int(match[2]))

    def at_least(self, version: str) -> bool:
        """True if this version is ``version`` or newer."""
        return self >= APIVersion.parse(version)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


MIN_VERSION = APIVersion(2, 1)
#: The newest microversion keel-api answers; advertised by version discovery.
MAX_VERSION = APIVersion(2, 104)


def _compute_entry(values: Iterable[str]) -> str | None:
    """The compute part of ``OpenStack-API-Version`` values, e.g. ``"2.53"``."""
    for value in values:
        for item in value.split(","):
            service, _, version = item.strip().partition(" ")
            if service.lower() == SERVICE_TYPE:
                return version.strip()
    return None


def requested(new_values: Iterable[str], legacy_values: Iterable[str]) -> str | None:
    """The version string the request asks for, or ``None`` if it does not ask."""
    version = _compute_entry(new_values)
    if version is not None:
        return version
    for value in legacy_values:
        return value.strip()
    return None


def negotiate(version: str | None) -> APIVersion:
    """The version to answer a request that asked for ``version``."""
    if version is None:
        return MIN_VERSION
    if version.lower() == "latest":
        return MAX_VERSION
    wanted = APIVersion.parse(version)
    if not MIN_VERSION <= wanted <= MAX_VERSION:
        raise NotAcceptable(
            f"Version {wanted} is not supported by the API. "
            f"Minimum is {MIN_VERSION} and maximum is {MAX_VERSION}."
        )
    return wanted


def response_headers(version: APIVersion) -> list[tuple[str, str]]:
    """The headers that tell the client which version answered."""
    return [
        (HEADER, f"{SERVICE_TYPE} {version}"),
        (LEGACY_HEADER, str(version)),
        ("Vary", f"{HEADER}, {LEGACY_HEADER}"),
    ]
