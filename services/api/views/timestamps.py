"""The two ways the compute API writes a time."""

from __future__ import annotations

from datetime import UTC, datetime


def isotime(value: datetime | None) -> str | None:
    """``2024-05-01T12:00:00Z``: seconds, UTC, as ``created`` and ``updated`` are shown."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def naive_isotime(value: datetime | None) -> str | None:
    """``2024-05-01T12:00:00.123456``: microseconds, UTC without a zone suffix."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(timespec="microseconds")
