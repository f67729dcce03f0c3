"""Query-string values read as Nova reads them: booleans and ISO 8601 times (400 otherwise)."""

from __future__ import annotations

from datetime import UTC, datetime

from services.api.http.faults import BadRequest

_TRUE = {"1", "t", "true", "on", "y", "yes"}
_FALSE = {"0", "f", "false", "off", "n", "no"}


def boolean(name: str, value: str, *, strict: bool = True) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE or (lowered == "" and name == "all_tenants"):
        return True
    if lowered in _FALSE or not strict:
        return False
    raise BadRequest(
        f"Invalid {name} value {value!r}: acceptable values are "
        f"{', '.join(sorted(_TRUE | _FALSE))}."
    )


def timestamp(name: str, value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BadRequest(
            f"Invalid input for query parameters {name}. Value: {value}. "
            f"'{value}' is not a 'date-time'"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
