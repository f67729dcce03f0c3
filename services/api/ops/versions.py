"""Releases and RPC pins on the operator's page: what a rolling upgrade is waiting for.

Each RPC API's cap in this keel-api (``KEEL_UPGRADE_LEVELS__*``: ``auto`` follows the
oldest live service of the binary that serves it, :mod:`shared.version_pins`), the
versions each binary runs, and the services still older than this release: until they
are upgraded (or forced down, or deleted), the pins stay back-level and what the newer
RPC versions bring stays off.
"""

from __future__ import annotations

from pydantic import BaseModel

from shared.db import services
from shared.db.pool import Connection
from shared.objects.service import Binary
from shared.version_pins import Pins, RpcPin
from shared.versions import release_name


class BinaryVersions(BaseModel):
    binary: str
    #: Release → how many live, not forced-down services of the binary run it.
    releases: dict[str, int]
    minimum: int
    minimum_release: str | None


class PinView(BaseModel):
    api: str
    #: The ``KEEL_UPGRADE_LEVELS__*`` setting: ``auto``, a release or ``X.Y``.
    setting: str
    #: The highest version of this API keel-api sends now.
    cap: str
    #: What this release speaks.
    latest: str
    #: The binary whose oldest service an ``auto`` pin follows.
    follows: str


class BehindView(BaseModel):
    host: str
    binary: str
    version: int
    release: str
    up: bool


class VersionsView(BaseModel):
    release: int
    release_name: str
    binaries: list[BinaryVersions]
    pins: list[PinView]
    #: Live, not forced-down services older than this release, oldest first.
    behind: list[BehindView]
    #: One sentence: what the upgrade waits for, or that it waits for nothing.
    waiting_for: str


def _label(version: int) -> str:
    return f"{version} ({release_name(version)})"


async def _binary(conn: Connection, binary: Binary) -> BinaryVersions:
    counts = await services.version_counts(conn, binary.value)
    minimum = min(counts, default=0)
    return BinaryVersions(
        binary=binary.value,
        releases={_label(version): n for version, n in sorted(counts.items())},
        minimum=minimum,
        minimum_release=release_name(minimum) if counts else None,
    )


async def _pin(pin: RpcPin) -> PinView:
    return PinView(
        api=pin.api, setting=pin.setting, cap=await pin.cap(), latest=pin.latest, follows=pin.binary
    )


def waiting_for(pins: list[PinView], behind: list[BehindView], release: int) -> str:
    held = [pin for pin in pins if pin.cap != pin.latest]
    if not held and not behind:
        return f"Nothing: every service runs release {_label(release)} or later."
    parts = [f"{pin.api} RPC capped at {pin.cap} (latest {pin.latest})" for pin in held]
    if behind:
        listed = ", ".join(f"{s.host} ({s.binary}, {_label(s.version)})" for s in behind[:10])
        more = f" and {len(behind) - 10} more" if len(behind) > 10 else ""
        parts.append(f"services to upgrade: {listed}{more}")
    return "; ".join(parts) + "."


async def versions_view(conn: Connection, pins: Pins, down_time: float) -> VersionsView:
    """The page's versions section; ``pins`` are keel-api's own (its release's)."""
    release = pins.compute.release
    binaries = [await _binary(conn, binary) for binary in Binary]
    behind = [
        BehindView(
            host=service.host,
            binary=service.binary,
            version=service.version,
            release=release_name(service.version),
            up=service.is_up,
        )
        for binary in Binary
        for service in await services.older_than(conn, binary.value, release, down_time)
    ]
    pin_views = [await _pin(pin) for pin in (pins.compute, pins.scheduler, pins.conductor)]
    return VersionsView(
        release=release,
        release_name=release_name(release),
        binaries=binaries,
        pins=pin_views,
        behind=behind,
        waiting_for=waiting_for(pin_views, behind, release),
    )
