"""Service versions and the RPC API versions each release speaks.

``SERVICE_VERSION`` is one integer for the whole code base. Every service stamps it into
its ``services`` row when it registers and on every heartbeat. A change that adds or
changes an RPC method bumps ``SERVICE_VERSION`` and appends a line to
``SERVICE_VERSION_HISTORY`` saying which RPC API versions that release speaks.

History:

* 0 — never used: a row with version 0 was written by something that did not report.
* 1 — first release: compute 1.0, conductor 1.0, scheduler 1.0.
* 2 — delivery semantics: conductor 1.1 (``check_build``: an agent asks whether a build
  it was sent is still wanted before and after creating the guest).
* 3 — stable compute identity: conductor 1.2 (``resolve_compute``: an agent asks what
  the database knows about its host before it creates an identity file or registers).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ReleaseApis(BaseModel):
    """The highest RPC API versions one service version speaks."""

    model_config = ConfigDict(frozen=True)

    compute: str
    conductor: str
    scheduler: str


SERVICE_VERSION_HISTORY: tuple[ReleaseApis | None, ...] = (
    None,
    ReleaseApis(compute="1.0", conductor="1.0", scheduler="1.0"),
    ReleaseApis(compute="1.0", conductor="1.1", scheduler="1.0"),
    ReleaseApis(compute="1.0", conductor="1.2", scheduler="1.0"),
)

SERVICE_VERSION = len(SERVICE_VERSION_HISTORY) - 1

#: The first release whose agents never register without an identity file the
#: conductor resolved first. A compute service row last written by an older release
#: may belong to an agent that kept no identity file: on upgrade, an agent without one
#: adopts its host's node UUID when that host has exactly one node.
STABLE_IDENTITY_VERSION = 3


def apis_for(service_version: int) -> ReleaseApis:
    """The RPC API versions spoken by ``service_version``; unknown versions are an error."""
    if not 0 < service_version < len(SERVICE_VERSION_HISTORY):
        raise ValueError(f"unknown service version {service_version}")
    apis = SERVICE_VERSION_HISTORY[service_version]
    assert apis is not None
    return apis


def parse_version(version: str) -> tuple[int, int]:
    """``"1.3"`` → ``(1, 3)``; anything else raises ``ValueError``."""
    major, _, minor = version.partition(".")
    if not major.isdigit() or not minor.isdigit():
        raise ValueError(f"bad RPC version {version!r}: expected MAJOR.MINOR")
    return int(major), int(minor)


def is_compatible(requested: str, served: str) -> bool:
    """The oslo.messaging rule: same major, and a minor no higher than the server's."""
    req_major, req_minor = parse_version(requested)
    srv_major, srv_minor = parse_version(served)
    return req_major == srv_major and req_minor <= srv_minor
