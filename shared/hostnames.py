"""Guest host names: made from a server's name, or asked for (compute microversion 2.90).

A server's host name is what its guest calls itself (the metadata service's and config
drive's ``hostname``) and what the compute API shows as ``OS-EXT-SRV-ATTR:hostname``.
Asked for, it is a single DNS label (2.90) or, from 2.94, a fully qualified name; not
asked for, it is made from the server's name when the server is created.
"""

from __future__ import annotations

import re
from uuid import UUID

#: A single label, as 2.90 to 2.93 take it: letters, digits and inner hyphens.
LABEL = re.compile(r"[a-zA-Z0-9]+[a-zA-Z0-9-]*[a-zA-Z0-9]+")
LABEL_LENGTH = (2, 63)
#: A fully qualified name, as 2.94 takes it (underscores too: real systems have them).
FQDN = re.compile(r"[a-zA-Z0-9-._]*")
FQDN_LENGTH = (1, 255)
#: The first microversion that takes a fully qualified name.
FQDN_VERSION = "2.94"


def from_name(name: str, instance_uuid: UUID) -> str:
    """The host name made from a server's name: lower case, letters, digits, ``-`` and
    ``.`` only, at most 63 characters; ``server-<uuid>`` if none is left."""
    text = re.sub(r"[ _]", "-", name.lower())
    text = re.sub(r"[^a-z0-9.-]", "", text)[:63].strip(".-")
    return text or f"server-{instance_uuid}"


def problem(hostname: str, *, fqdn: bool) -> str | None:
    """Why ``hostname`` cannot be asked for (as a single label, or ``fqdn``), or ``None``."""
    pattern, (shortest, longest) = (FQDN, FQDN_LENGTH) if fqdn else (LABEL, LABEL_LENGTH)
    if len(hostname) < shortest:
        return f"{hostname!r} is too short"
    if len(hostname) > longest:
        return f"{hostname!r} is too long"
    if pattern.fullmatch(hostname) is None:
        return f"{hostname!r} does not match '^{pattern.pattern}$'"
    return None
