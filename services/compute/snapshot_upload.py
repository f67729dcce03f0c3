"""Writing a snapshot's data to keel-api: an HTTP ``PUT`` of a file to a signed URL.

keel-api signs the URL when it asks for the snapshot (:mod:`shared.image_urls`); the
agent holds no API credentials. The file streams from disk (never whole in memory) with
its ``Content-Length``; keel-api hashes it as it arrives and makes the image ``active``
only once it is whole. Any answer but 204 is a failure, with keel-api's reason.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from shared.exceptions import KeelError

#: Seconds one write to keel-api may block before the upload fails.
WRITE_TIMEOUT = 120.0


def upload(url: str, path: Path, *, timeout: float = WRITE_TIMEOUT) -> int:
    """``PUT`` the file at ``path`` to ``url``; its size. Raises :class:`KeelError`."""
    if not url.startswith(("http://", "https://")):
        raise KeelError(f"the upload URL is not HTTP: {url.split('?', maxsplit=1)[0]}")
    size = path.stat().st_size
    where = url.split("?", maxsplit=1)[0]
    with path.open("rb") as data:
        request = urllib.request.Request(
            url,
            data=data,
            method="PUT",
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            reason = exc.read(2000).decode("utf-8", "replace").strip()
            raise KeelError(
                f"keel-api refused the snapshot's data ({exc.code}): {reason}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise KeelError(f"the snapshot's data could not be sent to {where}: {exc}") from None
    if status != 204:
        raise KeelError(f"keel-api answered {status} to the snapshot's data at {where}")
    return size
