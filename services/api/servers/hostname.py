"""A requested host name (microversion 2.90; fully qualified from 2.94), read as Nova reads it.

Create, update and rebuild take ``hostname`` alike, so they check it here: below 2.90 it
is an unknown field (400); from 2.90 a single DNS label of 2 to 63 letters, digits and
inner hyphens; from 2.94 a name of 1 to 255 letters, digits, ``-``, ``.`` and ``_``. The
guest is given it as it is asked for.
"""

from __future__ import annotations

from services.api.http.faults import BadRequest
from services.api.http.microversion import APIVersion
from shared import hostnames

#: The first microversion that takes a ``hostname``.
HOSTNAME_VERSION = "2.90"


def checked_hostname(value: object, version: APIVersion, *, where: str = "server") -> str:
    """``value`` if it is a host name this microversion takes; 400 otherwise.

    ``where``: the object of the body that holds it (``server``, ``rebuild``), named in
    the message when the field is unknown at this version.
    """
    if not version.at_least(HOSTNAME_VERSION):
        raise BadRequest(
            f"Invalid input for field/attribute {where}. Additional properties are not "
            f"allowed ('hostname' was unexpected): it needs microversion "
            f"{HOSTNAME_VERSION} or later."
        )
    if not isinstance(value, str):
        raise BadRequest(
            f"Invalid input for field/attribute hostname. Value: {value!r}. "
            f"{value!r} is not of type 'string'"
        )
    why = hostnames.problem(value, fqdn=version.at_least(hostnames.FQDN_VERSION))
    if why is not None:
        raise BadRequest(f"Invalid input for field/attribute hostname. Value: {value}. {why}")
    return value
