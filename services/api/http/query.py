"""Query strings read as Nova reads them: booleans, ISO 8601 times, unknown names (400)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime

from services.api.http.faults import BadRequest
from services.api.http.microversion import APIVersion

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


def refuse_unknown(
    names: Iterable[str], known: Collection[str], version: APIVersion, *, since: str = "2.75"
) -> None:
    """400 for a query parameter the route does not know, from ``since`` on.

    Nova's query schemas ignored unknown names until 2.75, then (for most of the routes
    keel serves) forbade them, so a misspelt filter is an error instead of a silent
    "everything". The message is jsonschema's, as Nova's is.
    """
    if not version.at_least(since):
        return
    unknown = sorted({name for name in names if name not in known})
    if not unknown:
        return
    quoted = ", ".join(repr(name) for name in unknown)
    verb = "was" if len(unknown) == 1 else "were"
    raise BadRequest(f"Additional properties are not allowed ({quoted} {verb} unexpected)")
