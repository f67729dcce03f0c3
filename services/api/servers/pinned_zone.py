"""``pinned_availability_zone`` on ``PUT /servers/{id}`` (microversion 2.104).

A server is pinned to the zone its create asked for: its later moves stay in that zone.
From 2.104 an update may unpin it (``null``) or pin it again, but only to the zone it is
in now; changing one pin for another is a 409 (unpin first), as in Nova. Setting the pin
it already has changes nothing.
"""

from __future__ import annotations

from services.api.http.faults import BadRequest, ConflictingRequest
from services.api.http.microversion import APIVersion
from services.api.servers.lookup import zone_of
from shared.db import request_specs
from shared.db.pool import Connection
from shared.objects.instance import Instance

#: The first microversion that changes the pin.
PIN_VERSION = "2.104"


def checked_zone(value: object, version: APIVersion) -> str | None:
    """The zone asked for (``None``: unpin); 400 if this microversion does not take it or
    it is no zone name."""
    if not version.at_least(PIN_VERSION):
        raise BadRequest(
            "Invalid input for field/attribute server. Additional properties are not allowed "
            f"('pinned_availability_zone' was unexpected): it needs microversion {PIN_VERSION} "
            "or later."
        )
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 255 or value != value.strip():
        raise BadRequest(
            f"Invalid input for field/attribute pinned_availability_zone. Value: {value!r}. "
            "It must be null or a name of 1 to 255 characters without leading or trailing "
            "whitespace."
        )
    return value


async def repin(
    conn: Connection, instance: Instance, wanted: str | None, *, down_time: float
) -> None:
    """Unpin or pin ``instance`` as asked, in the caller's transaction; 409 for a change
    Nova refuses."""
    _, current = await request_specs.lock_pinned_zone(conn, instance.uuid)
    if wanted is None:
        if current is not None:
            await request_specs.set_pinned_zone(conn, instance.uuid, None)
        return
    if current is not None:
        if wanted != current:
            raise ConflictingRequest(
                "Cannot change pinned availability zone directly. Unpin first by setting "
                "pinned_availability_zone to null."
            )
        return
    here = await zone_of(conn, instance, down_time)
    if wanted != here:
        raise ConflictingRequest(
            f"Server can only be pinned to its current availability zone '{here}', but "
            f"'{wanted}' was requested."
        )
    await request_specs.set_pinned_zone(conn, instance.uuid, wanted)
