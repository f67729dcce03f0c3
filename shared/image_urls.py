"""Signed, short-lived image download and upload URLs: how agents fetch image data, and
write a snapshot's, without API credentials.

keel-conductor signs a URL for each image a build needs; keel-api serves the data to
whoever presents a valid one. The signature is an HMAC-SHA256, under the secret the two
share (``KEEL_IMAGES__URL_SECRET``), of the image id and the URL's expiry time (Unix
seconds), so a URL is good for one image and a few minutes. The expiry is wall-clock
time: the conductors' and api hosts' clocks must agree to within a fraction of the TTL
(NTP).

An upload URL (a snapshot's: keel-api signs it when it asks the agent for the snapshot)
is signed the same way over ``upload``, the image id and the expiry, so a download URL
is never good for an upload, nor one the other way round.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import urlencode
from uuid import UUID

#: Path of the download route under keel-api's base URL.
DOWNLOAD_PATH = "/image/download"
#: Path of the upload route (a snapshot's data, from an agent).
UPLOAD_PATH = "/image/upload"


def signature(secret: str, image_id: UUID, expires: int, *, upload: bool = False) -> str:
    prefix = "upload\n" if upload else ""
    message = f"{prefix}{image_id}\n{expires}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_url(
    base_url: str, secret: str, image_id: UUID, ttl: float, *, now: float | None = None
) -> str:
    expires = int((time.time() if now is None else now) + ttl)
    query = urlencode({"expires": expires, "signature": signature(secret, image_id, expires)})
    return f"{base_url.rstrip('/')}{DOWNLOAD_PATH}/{image_id}?{query}"


def signed_upload_url(
    base_url: str, secret: str, image_id: UUID, ttl: float, *, now: float | None = None
) -> str:
    """A URL an agent sends (``PUT``) a snapshot's data to, for image ``image_id`` only."""
    expires = int((time.time() if now is None else now) + ttl)
    sig = signature(secret, image_id, expires, upload=True)
    query = urlencode({"expires": expires, "signature": sig})
    return f"{base_url.rstrip('/')}{UPLOAD_PATH}/{image_id}?{query}"


def refusal(
    secret: str | None,
    image_id: UUID,
    expires: str | None,
    given: str | None,
    *,
    now: float | None = None,
    upload: bool = False,
) -> str | None:
    """Why a download (or, with ``upload``, an upload) URL is refused; ``None`` when valid."""
    if secret is None:
        return "download URLs are not enabled (KEEL_IMAGES__URL_SECRET is unset)"
    if expires is None or given is None or not expires.isdigit():
        return "the URL carries no expiry or signature"
    if not hmac.compare_digest(signature(secret, image_id, int(expires), upload=upload), given):
        return "the signature does not match (forged, or signed with another secret)"
    if int(expires) < (time.time() if now is None else now):
        return "the URL has expired"
    return None
